"""Shared by the end-to-end editor tests: where failure artifacts go, and a hook that adds
an editor session's screenshot and server log to a failing test's report.

A fixture value with a ``failure_report(name) -> str`` method (e.g. the VS Code session)
is asked for one when a test using it fails; the text is shown as an "e2e" section.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> Path:
    """Screenshots and logs of failures: ASSISTD_E2E_ARTIFACTS, else pytest's tmp dir."""
    if os.environ.get("ASSISTD_E2E_ARTIFACTS"):
        path = Path(os.environ["ASSISTD_E2E_ARTIFACTS"])
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("e2e-artifacts")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for value in getattr(item, "funcargs", {}).values():
        describe = getattr(value, "failure_report", None)
        if callable(describe):
            try:
                report.sections.append(("e2e", describe(item.name)))
            except Exception as e:  # noqa: BLE001 - the failure itself must still be reported
                report.sections.append(("e2e", f"no failure report: {e!r}"))
