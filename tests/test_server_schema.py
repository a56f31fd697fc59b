"""Schemathesis over /openapi.json: whatever a client sends, the API never answers 500.

Writes are fuzzed with the token, so bodies get past auth into validation; the job worker is
stubbed so a valid random job does not start real load.
"""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="pip install schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

from server.app import create_app  # noqa: E402
from tests.helpers import store_sweep  # noqa: E402

# Fuzzing every endpoint takes ~40 s.
pytestmark = pytest.mark.slow


TOKEN = "fuzz-token"


def _app(tmp_path_factory):
    db = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'fuzz.db'}"
    store_sweep(db, gpu="B200-SXM", per_point=10)
    store_sweep(db, gpu="H100-SXM", per_point=10, gpu_count=2)
    app = create_app(
        db, api_token=TOKEN, allow_hosts=[], open_reads=True, server_names=["testserver"]
    )
    app.state.tb.jobs._execute = lambda job: "completed"  # no real load from fuzzed jobs
    return app


@pytest.fixture(scope="session")
def fuzz_app(tmp_path_factory):
    app = _app(tmp_path_factory)
    yield app
    app.state.tb.jobs.shutdown()


schema = schemathesis.pytest.from_fixture("fuzz_schema")


@pytest.fixture(scope="session")
def fuzz_schema(fuzz_app):
    return schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)


@schema.parametrize()
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_server_errors(case):
    case.call_and_validate(
        headers={"Authorization": f"Bearer {TOKEN}"}, checks=[not_a_server_error]
    )
