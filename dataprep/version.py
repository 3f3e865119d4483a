"""The package version: takes nothing, gives `__version__`, the string stamped into every manifest.

A leaf (it imports nothing of dataprep), so the builds that record it never import the package root, and
setup.cfg reads it without importing the package.
"""
__version__ = "0.1.0"
