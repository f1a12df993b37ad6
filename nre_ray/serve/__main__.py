"""``python -m nre_ray.serve``: serve a trained model over HTTP on Ray Serve (:mod:`nre_ray.serve.app`), with
MLflow's scoring API, until Ctrl-C."""

from __future__ import annotations

import sys

from nre_ray.run.frontdoor import run_command
from nre_ray.serve.cli import build_parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (2 bad settings or model, 130 after Ctrl-C)."""
    args = build_parser().parse_args(argv)
    # Ray, torch and MLflow only now: --help and a usage error answer at once
    # deferred: importing it loads ray, torch, starlette, pandas, pyarrow, numpy
    from nre_ray.serve.app import serve_until_interrupted

    def work() -> tuple[dict, None]:
        return serve_until_interrupted(args), None

    return run_command(work, show=lambda summary: None,
                       interrupted="interrupted: the application was shut down", quiet={"ray.serve": 40})


if __name__ == "__main__":
    from nre_ray.core.console import exit_status

    sys.exit(exit_status(main))
