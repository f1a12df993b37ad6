"""The worker loop stays readable: its state travels as one object (:class:`nre_ray.run.loop.WorkerRun`), so no
function in nre_ray/run/loop.py takes more than 10 parameters, and ``train_loop_per_worker`` fits on a screen (read
from the AST)."""

import ast
from pathlib import Path

MAX_PARAMETERS = 10
MAX_LOOP_LINES = 60
LOOP = Path(__file__).resolve().parents[2] / "nre_ray" / "run" / "loop.py"


def _functions() -> list[ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda]:
    tree = ast.parse(LOOP.read_text(encoding="utf-8"))
    return [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)]


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> int:
    args = node.args
    return (len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs) + (args.vararg is not None)
            + (args.kwarg is not None))


def test_no_function_in_the_loop_takes_more_than_10_parameters():
    functions = _functions()
    assert len(functions) > 20  # the file was read
    wide = {f"{getattr(node, 'name', 'lambda')} (line {node.lineno})": _parameters(node) for node in functions
            if _parameters(node) > MAX_PARAMETERS}
    assert wide == {}


def test_train_loop_per_worker_fits_on_a_screen():
    [loop] = [node for node in _functions() if getattr(node, "name", None) == "train_loop_per_worker"]
    lines = loop.end_lineno - loop.lineno + 1  # the whole definition, docstring included
    assert lines <= MAX_LOOP_LINES, lines
