"""The shipped training recipes: TOML files in this package, so that an installed wheel has
them (``attnlab train NAME``, ``attnlab recipes``).

A recipe is found by :func:`find_recipe`: a path as given, then ``./configs/NAME.toml`` in the
working directory (a project's own recipes win over the shipped ones of the same name), then
the shipped ``NAME.toml`` here. Each recipe says what it is in its first comment lines
(:func:`describe`).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError, MissingFileError

RECIPES = Path(__file__).resolve().parent  # the shipped *.toml (package data)
LOCAL = Path("configs")  # the working directory's own recipes, first


def shipped() -> dict[str, Path]:
    """The shipped recipes by name, sorted."""
    return {p.stem: p for p in sorted(RECIPES.glob("*.toml"))}


def local() -> dict[str, Path]:
    """The recipes in ``./configs`` of the working directory by name (none without one)."""
    return {p.stem: p for p in sorted(LOCAL.glob("*.toml")) if p.is_file()} \
        if LOCAL.is_dir() else {}


def not_a_folder(path: Path) -> None:
    """Refuse a folder given as a recipe file, in one line."""
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder; give a .toml recipe file, or a "
                          "recipe name (`attnlab recipes`)")


def recipe_text(path: Path) -> str:
    """The text of recipe file ``path``; one line for a file that is not UTF-8 text."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text ({e.reason} at byte "
                          f"{e.start}): a recipe is a TOML file") from None


def find_recipe(name: str) -> Path:
    """The recipe file of ``name``: a path to a file; else a recipe name (``NAME`` or the
    README's ``configs/NAME.toml``), from ``./configs`` first, then the shipped ones.

    Raises:
        FileNotFoundError: neither; the message lists the recipe names there are.
    """
    path = Path(name)
    if path.is_file():
        return path
    not_a_folder(path)
    stem = None
    if path.suffix != ".toml" and len(path.parts) == 1:
        stem = name
    elif path.suffix == ".toml" and path.parts[:-1] == (LOCAL.name,):
        stem = path.stem  # `attnlab train configs/X.toml` outside a checkout: the shipped X
    if stem is not None:
        for folder in (LOCAL, RECIPES):
            candidate = folder / f"{stem}.toml"
            if candidate.is_file():
                return candidate
    known = sorted({*shipped(), *local()})
    raise MissingFileError(f"config file {name} does not exist (give a .toml file or a recipe "
                           f"name; recipes: {', '.join(known)}; `attnlab recipes` says what "
                           "each one trains)")


def describe(path: Path) -> str:
    """What a recipe trains: the whole first sentence of the comment lines it starts with, on
    one line (``attnlab recipes`` wraps it); empty when it starts with none."""
    words: list[str] = []
    for line in recipe_text(path).splitlines():
        text = line.strip()
        if not text.startswith("#"):
            break
        text = text.lstrip("#").strip()
        if text.startswith("attnlab ") or not text:  # the commands under the description
            break
        words += text.split()
        if text.endswith("."):
            break
    sentence = ""
    for word in words:
        sentence = f"{sentence} {word}".strip()
        if word.endswith(".") and not word[:-1].replace(".", "").isdigit():
            break
    return sentence


__all__ = ["RECIPES", "describe", "find_recipe", "local", "recipe_text", "shipped"]
