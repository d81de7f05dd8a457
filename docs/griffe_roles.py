"""The reST roles of attnlab's docstrings as links of the API reference (a griffe extension).

The docstrings name other objects the way ``help()`` readers and Sphinx know,
``:class:`~attnlab.config.ModelConfig```, ``:func:`generate```, ``:mod:`.bert```. Markdown has no
such roles, so mkdocstrings would print them as they are. When griffe has loaded the package,
this extension rewrites each role in every docstring into a cross-reference of mkdocs-autorefs,
``[`ModelConfig`][attnlab.config.ModelConfig]``, resolving the name the way Python would read
it where the docstring stands: an absolute path, a path relative to the module (``.bert``), or
a name in the scope of the object (its members, its module's names and imports, the parents).
The ``~`` form shows the last name only, as in Sphinx. A name that is not attnlab's (``torch``
objects), or that is private (a helper the reference does not render), stays inline code: the
strict build would otherwise fail on a link without a target. mkdocs.yml registers it under
the python handler's ``extensions``. An object with a docstring is a link the strict build
checks (a page must render it); a package, or an object without one (a constant, a field),
is linked where a page renders it and is inline code elsewhere. tests/test_docs.py checks
that the built reference holds no role text and links where the roles were.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?P<role>class|func|meth|data|mod|attr|exc|obj|const):"
                  r"`(?P<target>[^`]+)`")
PACKAGE = "attnlab"


def _public(path: str) -> bool:
    """Whether the reference renders an object of this path (no private part below attnlab)."""
    return all(not (p.startswith("_") and not p.startswith("__")) for p in path.split(".")[1:])


class RoleLinks(griffe.Extension):
    """Rewrite ``:role:`name``` in every docstring of the package into an autorefs link."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader,
                   **kwargs: Any) -> None:
        if pkg.name != PACKAGE:
            return
        self.collection = loader.modules_collection
        self._walk(pkg, seen=set())

    def _walk(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None and ":" in obj.docstring.value:
            obj.docstring.value = ROLE.sub(lambda m: self._link(m, obj), obj.docstring.value)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member, seen)

    def _link(self, m: re.Match, obj: griffe.Object) -> str:
        text = m["target"].strip()
        short = text.startswith("~")
        name = text.lstrip("~").removesuffix("()")
        shown = name.rsplit(".", 1)[-1] if short else name
        if m["role"] in ("func", "meth") and not shown.endswith(")"):
            shown += "()"
        found = self._resolve(name, obj)
        if found is None or not _public(found.path):
            return f"`{shown}`"
        if found.docstring and not found.is_init_module:  # a link the strict build checks
            return f"[`{shown}`][{found.path}]"
        # a package (the pages render its modules), or no docstring (a constant, a field):
        # linked where a page renders it, else inline code
        return f'<autoref identifier="{found.path}" optional><code>{shown}</code></autoref>'

    def _resolve(self, name: str, obj: griffe.Object) -> griffe.Object | None:
        """The path of the object ``name`` means in the docstring of ``obj``, if attnlab's."""
        module = obj if obj.is_module else obj.module
        if name.startswith("."):  # relative to the module's package, as an import reads it
            dots = len(name) - len(name.lstrip("."))
            base = module.path.split(".")
            if not module.is_package:
                base = base[:-1]
            base = base[:len(base) - (dots - 1)] if dots > 1 else base
            candidates = [".".join([*base, name.lstrip(".")])]
        else:
            candidates = [name]
            head, _, rest = name.partition(".")
            try:
                resolved = obj.resolve(head)
                candidates.append(resolved + ("." + rest if rest else ""))
            except (griffe.NameResolutionError, Exception):  # noqa: BLE001
                pass
            # the module's package, then attnlab itself (a name the package re-exports)
            candidates += [f"{module.path}.{name}", f"{PACKAGE}.{name}"]
        for path in candidates:
            found = self._final(path)
            if found is not None:
                return found
        return None

    def _final(self, path: str) -> griffe.Object | None:
        if path.split(".")[0] != PACKAGE:
            return None
        try:
            target = self.collection.get_member(path)
        except Exception:  # noqa: BLE001 - not an object of the package
            return None
        try:
            while target.is_alias:
                target = target.final_target
        except Exception:  # noqa: BLE001 - an alias of something outside the package
            return None
        return target if target.path.split(".")[0] == PACKAGE else None
