"""No signal is wired straight to a method with optional parameters.

`button.clicked.connect(self.pick_file)` delivered clicked's `checked=False` into
`pick_file(path=None)`, and the "Open a .gguf file…" button died with "expected str … not bool".
PySide passes a signal's arguments to any slot that can take them, so a slot with optional
parameters must be wrapped (`lambda _checked=False: self.pick_file()`).
"""
from __future__ import annotations

import ast
from pathlib import Path

UI = Path(__file__).resolve().parents[2] / "app" / "ggufdesk" / "ui"


def optional_params(fn: ast.FunctionDef) -> list[str]:
    args = fn.args
    positional = args.posonlyargs + args.args
    names = [a.arg for a in positional[len(positional) - len(args.defaults):]] if args.defaults else []
    return [n for n in names if n != "self"]


def risky_connections(source: str) -> list[str]:
    tree = ast.parse(source)
    methods: dict[str, ast.FunctionDef] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    methods[item.name] = item
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "connect" and node.args):
            continue
        target = node.args[0]
        if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                and target.value.id == "self" and target.attr in methods):
            opt = optional_params(methods[target.attr])
            if opt:
                found.append(f"line {node.lineno}: .connect(self.{target.attr}) with optional {opt}")
    return found


def test_the_checker_finds_the_original_bug():
    bad = ("class P:\n    def __init__(self):\n        self.b.clicked.connect(self.pick_file)\n"
           "    def pick_file(self, path=None):\n        pass\n")
    assert risky_connections(bad) == ["line 3: .connect(self.pick_file) with optional ['path']"]
    good = bad.replace("connect(self.pick_file)", "connect(lambda _c=False: self.pick_file())")
    assert risky_connections(good) == []


def test_no_ui_module_wires_a_signal_to_optional_parameters():
    problems = []
    for path in sorted(UI.glob("*.py")):
        problems += [f"{path.name} {p}" for p in risky_connections(path.read_text())]
    assert problems == []
