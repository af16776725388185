"""The package version, from the installed distribution (a module that imports nothing of
kernel_lens, so any layer may read it)."""

from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("kernel_lens")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+source"
