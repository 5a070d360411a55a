"""User-facing errors. The CLI prints their message and exits 2; besides them it catches only an
``OSError`` (a path the user gave that cannot be used), printed as one line too."""

from __future__ import annotations


class TreegymError(Exception):
    """An error whose message tells the user what went wrong and what to do."""


class ConfigError(TreegymError, ValueError):
    """A wrong option, argument or config value."""


class MissingPackageError(TreegymError, ImportError):
    """An optional package that a feature needs is not installed."""

    def __init__(self, package: str, feature: str, install: str | None = None) -> None:
        self.package = package
        hint = install or f"pip install {package}"
        super().__init__(f"{feature} needs the package '{package}', which is not installed: run `{hint}`")


class IndexFormatError(TreegymError):
    """An index folder is corrupt, or was built for another corpus, embedder or version."""


class SnapshotError(TreegymError, TypeError):
    """A snapshot that this env's ``snapshot()`` did not make (a hand-made or forged one)."""
