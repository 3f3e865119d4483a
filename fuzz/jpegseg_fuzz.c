/* Takes one fuzzer input, gives nothing or an abort: the libFuzzer harness of images/_jpegseg.c.
 *
 * The extension's source is compiled into this program (under AddressSanitizer and
 * UndefinedBehaviorSanitizer, with libFuzzer's coverage) and registered as dataprep.images._jpegseg
 * before Python imports dataprep, so that images/jpegseg.py calls this instrumented copy. Each input then
 * goes to fuzz/agree.py's check(), which calls both entry points (region, add_restarts) and the Python
 * path beside them, and raises where they disagree: that is turned into a crash libFuzzer records.
 * fuzz/run.py builds and runs it (`make fuzz`).
 */
#include "../dataprep/images/_jpegseg.c"

static PyObject *check;

static void fail(const char *what) {
    if (PyErr_Occurred()) PyErr_Print();
    fprintf(stderr, "jpegseg_fuzz: %s\n", what);
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    /* the venv's interpreter path: its pyvenv.cfg gives the site-packages dataprep's dependencies are in */
    const char *python = getenv("FUZZ_PYTHON");
    if (python && PyStatus_Exception(PyConfig_SetBytesString(&config, &config.executable, python)))
        fail("FUZZ_PYTHON is not a usable path");
    if (PyStatus_Exception(Py_InitializeFromConfig(&config))) fail("Python did not start");
    PyConfig_Clear(&config);
    PyObject *mod = PyInit__jpegseg();
    if (!mod || PyDict_SetItemString(PyImport_GetModuleDict(), "dataprep.images._jpegseg", mod)) fail("no module");
    PyObject *agree = PyImport_ImportModule("agree"); /* fuzz/ is on PYTHONPATH */
    if (!agree) fail("fuzz/agree.py did not import (PYTHONPATH must hold the repository and fuzz/)");
    check = PyObject_GetAttrString(agree, "check");
    PyObject *uses = PyObject_CallMethod(agree, "uses", "O", mod);
    if (!check || !uses || !PyObject_IsTrue(uses)) fail("images/jpegseg.py does not call the instrumented module");
    Py_DECREF(uses);
    Py_DECREF(mod);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* a view of libFuzzer's own copy of the input, allocated to its exact size: a bytes object would
     * carry a terminating NUL that hides a read one byte past the end from AddressSanitizer */
    PyObject *view = PyMemoryView_FromMemory((char *)data, (Py_ssize_t)size, PyBUF_READ);
    if (!view) fail("out of memory");
    PyObject *res = PyObject_CallOneArg(check, view);
    if (!res) fail("the C and Python paths disagree, or one raised (traceback above)");
    Py_DECREF(res);
    res = PyObject_CallMethod(view, "release", NULL);
    if (!res) fail("fuzz/agree.py kept a reference to the input past the call");
    Py_DECREF(res);
    Py_DECREF(view);
    return 0;
}
