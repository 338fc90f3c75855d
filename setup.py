# setuptools needs setup.py for cffi_modules; everything else lives in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["native/build_native.py:ffibuilder"])
