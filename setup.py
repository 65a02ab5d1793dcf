"""Build settings pyproject.toml cannot hold: the serving benchmark's optional C reader.

`engine._streamread` is StreamSelector's loop turn in C (engine/eventloop.py). It is optional: where
no C compiler or Python headers are found the install goes on and the same loop runs in Python.
"""

import sys

from setuptools import Extension, setup

ext_modules = []
if sys.platform.startswith("linux") and sys.implementation.name == "cpython":  # epoll, CPython's C API
    ext_modules.append(Extension("engine._streamread", ["engine/_streamread.c"], optional=True))

setup(ext_modules=ext_modules)
