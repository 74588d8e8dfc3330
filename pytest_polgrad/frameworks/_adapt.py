"""Shared helpers of the framework adapters: the installed-version guard."""

from __future__ import annotations

import importlib.metadata

from pytest_polgrad.frameworks._pins import PINS

__all__ = ["FrameworkNotInstalled", "installed_version", "require_installed"]


class FrameworkNotInstalled(ImportError):
    """The framework an adapter calls is not importable in this environment."""


def installed_version(framework: str) -> str | None:
    """The installed distribution version of ``framework`` (None when not installed)."""
    try:
        return importlib.metadata.version(PINS[framework].distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def require_installed(framework: str) -> str:
    """The installed version; :class:`FrameworkNotInstalled` naming the pin otherwise."""
    version = installed_version(framework)
    if version is None:
        pin = PINS[framework]
        raise FrameworkNotInstalled(
            f"{framework} is not installed; the framework tier pins {pin.distribution}=="
            f"{pin.version} (run `make frameworks`, which builds .venv-frameworks)"
        )
    return version
