"""Normalised-AST similarity: KernelBench decontamination and duplicate detection.

A program is normalised by dropping docstrings, annotations and module-level size
constants, renaming every identifier it defines (locals, arguments, functions, ``self.``
attributes, constants) to ``v0, v1, ...`` in order of appearance, and abstracting numbers;
library names (``torch``, ``nn.Conv2d``, ``.relu``) are kept. The compared sequence is the
``Model`` class's tokens without punctuation and the boilerplate every task shares
(``class Model(nn.Module)``, ``def __init__``, ``super().__init__()``, ``self``), so that
two one-operator tasks with different operators do not look alike through their
scaffolding. Similarity is difflib's ratio of the two token sequences; two programs with
the same sequence are duplicates.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import io
import tokenize
from pathlib import Path

KEEP = {"Model", "forward", "__init__", "get_inputs", "get_init_inputs", "self", "super"}
BOILERPLATE = {"self", "super", "__init__", "def", "class", "Model", "forward", "Module",
               "torch", "nn", "F", "functional"}
OPERATORS = {"+", "-", "*", "/", "//", "%", "**", "@", "<", ">", "<=", ">=", "==", "!=", "~",
             "&", "|", "^", "+=", "-=", "*=", "/=", "["}


class _Normaliser(ast.NodeTransformer):
    def __init__(self, defined: set[str]):
        self.defined = defined
        self.names: dict[str, str] = {}

    def rename(self, name: str) -> str:
        if name in KEEP or name not in self.defined:
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self.rename(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self.rename(node.arg)
        node.annotation = None
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            node.attr = self.rename(node.attr)
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.name = self.rename(node.name)
        node.returns = None
        node.body = _strip_doc(node.body)
        self.generic_visit(node)
        return node

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        node.name = self.rename(node.name)
        node.body = _strip_doc(node.body)
        self.generic_visit(node)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        self.generic_visit(node)
        return ast.Assign(targets=[node.target], value=node.value or ast.Constant(None),
                          lineno=node.lineno)

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, (int, float, complex)) and not isinstance(node.value, bool):
            return ast.Name(id="NUM")
        return node


def _strip_doc(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body or [ast.Pass()]


def _defined(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id == "self"):
            names.add(node.attr)
    return names


def normalise(code: str) -> list[str]:
    """Token sequence of the normalised program (raises SyntaxError on bad code)."""
    tree = ast.parse(code)
    tree.body = [node for node in _strip_doc(tree.body)
                 if not isinstance(node, (ast.Import, ast.ImportFrom))
                 and not (isinstance(node, ast.Assign) and _literal(node.value))]
    tree = _Normaliser(_defined(tree)).visit(tree)
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"),
                 None)
    flow = _dataflow(model) if model is not None else None
    text = flow if flow is not None else ast.unparse(ast.fix_missing_locations(
        model if model is not None else tree))
    tokens = []
    for t in tokenize.generate_tokens(io.StringIO(text).readline):
        if t.type == tokenize.NAME and t.string not in BOILERPLATE:
            tokens.append("V" if t.string[:1] == "v" and t.string[1:].isdigit()
                          else t.string.lower())
        elif (t.type == tokenize.OP and t.string in OPERATORS) or t.type == tokenize.STRING:
            tokens.append(t.string)
    return tokens


def _dataflow(model: ast.ClassDef) -> str | None:
    """The forward pass as one expression (straight-line code only), modules inlined."""
    methods = {n.name: n for n in model.body if isinstance(n, ast.FunctionDef)}
    if "forward" not in methods:
        return None
    attrs: dict[str, ast.expr] = {}
    for node in ast.walk(methods.get("__init__", ast.Pass())):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Attribute)):
            attrs[node.targets[0].attr] = node.value
    env: dict[str, ast.expr] = {}

    class Inline(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            return env.get(node.id, node)

        def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
            if isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in attrs:
                return attrs[node.attr]
            self.generic_visit(node)
            return ast.Name(id=node.attr) if _library(node.value) else node

    for stmt in methods["forward"].body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            value = Inline().visit(stmt.value)
            target = stmt.targets[0]
            if isinstance(target, ast.Name):
                env[target.id] = value
            elif isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name)
                                                       for e in target.elts):
                for i, e in enumerate(target.elts):
                    env[e.id] = ast.Subscript(value=value, slice=ast.Constant(i))
            else:
                return None
        elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            env[stmt.target.id] = ast.BinOp(left=env.get(stmt.target.id, stmt.target),
                                            op=stmt.op, right=Inline().visit(stmt.value))
        elif isinstance(stmt, ast.Return) and stmt.value is not None:
            text = ast.unparse(ast.fix_missing_locations(Inline().visit(stmt.value)))
            return text if len(text) < 50_000 else None
        else:
            return None
    return None


def _library(node: ast.expr) -> bool:
    """``torch``, ``nn``, ``F``, ``torch.nn.functional``...: prefixes that name no data."""
    if isinstance(node, ast.Name):
        return node.id in ("torch", "nn", "F", "functional", "Tensor")
    return isinstance(node, ast.Attribute) and _library(node.value)


def _literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


def structure_key(code: str) -> str:
    """Identical for programs that differ only in names, sizes, comments and docstrings."""
    return hashlib.sha256("\x00".join(normalise(code)).encode()).hexdigest()[:24]


def similarity(a: list[str], b: list[str]) -> float:
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


class KernelBenchIndex:
    """Normalised forms of a KernelBench set, computed once per run."""

    def __init__(self, entries: list[tuple[str, list[str]]], source: str = ""):
        self.entries = entries
        self.source = source

    @classmethod
    def load(cls, path: Path | str) -> KernelBenchIndex:
        from cuda_agent.tasks.loaders import load_tasks

        entries = []
        for task in load_tasks(str(path)):
            try:
                entries.append((task.label, normalise(task.code)))
            except SyntaxError:
                continue
        return cls(entries, str(path))

    def best(self, code: str, exclude: str | None = None) -> tuple[float, str]:
        """(highest similarity, label of that problem); ``exclude`` skips one label."""
        tokens = normalise(code)
        best, label = 0.0, ""
        for name, other in self.entries:
            if name == exclude:
                continue
            matcher = difflib.SequenceMatcher(None, tokens, other, autojunk=False)
            if matcher.real_quick_ratio() <= best or matcher.quick_ratio() <= best:
                continue  # upper bounds of the ratio: this one cannot beat the best
            score = matcher.ratio()
            if score > best:
                best, label = score, name
        return best, label
