"""The measurement lab: the bench and its figures, sweeps, the load test, the GPU check, the kernel bench, the
calibration of the draft graph and the throughput probe. It may import anything in the product (specscope.backend,
specscope.kernels); nothing in the product imports it. The CLI names its commands by module (cli/__init__.py's
COMMANDS) and imports one only when it runs."""
