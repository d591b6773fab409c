"""The page's static files, shipped in the package (package-data), read as text."""

from importlib import resources


def asset(name: str) -> str:
    return resources.files("ridgeline.dashboard").joinpath("static", name).read_text()
