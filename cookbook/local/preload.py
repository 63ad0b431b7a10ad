"""``python -m cookbook.local.preload``: print the ``COOKBOOK_PRELOAD`` value for this machine (Makefile)."""

from cookbook.local import preload_value

print(preload_value())
