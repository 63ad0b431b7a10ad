"""The local CPU bench: the embedded Slurm cluster (``cluster``), the CPU shims for torchtune/torchtitan
(``compat``), the tiny models and datasets (``assets``), a fake NVML (``fake_nvml``) and ``make demo`` (``demo``).

It depends on the engine; the engine never imports it (tests/unit/test_import_graph.py). A ``local-cpu``
job reaches the shims only through what its rendered script runs (``python -m cookbook.local.compat.cpu``).
"""
