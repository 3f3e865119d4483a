"""The compiled part: dataprep/images/_jpegseg.c (restart segments of JPEGs: region cuts for training crops,
lossless restart markers for kept source JPEGs). Everything else is declared in setup.cfg.

The extension is optional: where it does not build (no C compiler, no Python headers) the install goes on
without it and images/jpegseg.py takes its pure-Python path (the same region bytes; kept sources stay
without restart markers, so their crops decode whole)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("dataprep.images._jpegseg", ["dataprep/images/_jpegseg.c"], optional=True,
                             extra_compile_args=["-O2"])])
