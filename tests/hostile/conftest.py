"""Fixtures and judgement of the hostile battery (`make hostile`; `make test` leaves it out by its marker).

Each case gets `case`: a directory of its own in one scratch tree per session (per xdist worker), beside the
fixtures built once (`case.fx`: the tiny and demo models and checkpoints, hostile checkpoints and graphs). The tree
is snapshotted before the case's first command and compared after the test body: a file that appeared or changed
outside the case's named outputs fails the case, whatever the command said."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .scratch import Case, Fixtures
from .support import Finding

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/hostile is marked `hostile`."""
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.hostile)


@pytest.fixture(scope="session")
def fx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixtures]:
    fixtures = Fixtures(tmp_path_factory.mktemp("hostile"))
    yield fixtures
    fixtures.cleanup()


@pytest.fixture
def case(fx: Fixtures, request: pytest.FixtureRequest) -> Iterator[Case]:
    trial = Case(fx, request.node.name)
    yield trial
    trial.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """After a case's body: what the scratch tree shows outweighs what the command said (the battery's order)."""
    __tracebackhide__ = True
    case = getattr(item, "funcargs", {}).get("case")
    if not isinstance(case, Case):
        return (yield)
    try:
        result = yield
    except Finding as verdict:
        case.failed = True
        case.judge(verdict)
        raise
    except Exception:
        case.failed = True
        raise
    try:
        case.judge(None)
    except Finding:
        case.failed = True
        raise
    return result
