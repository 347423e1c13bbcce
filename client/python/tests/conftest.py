"""Fixtures: the integration tests need PG_IDEM_TEST_DSN (as the C++ client's);
they create the database idem_py_test with the extension and drop it after."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psycopg  # noqa: E402

DB = "idem_py_test"


@pytest.fixture(scope="session")
def dsn():
    base = os.environ.get("PG_IDEM_TEST_DSN")
    if not base:
        pytest.skip("PG_IDEM_TEST_DSN is not set")
    with psycopg.connect(base, autocommit=True) as c:
        c.execute("SET client_min_messages = warning")
        c.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB)
        c.execute("CREATE DATABASE %s" % DB)
    own = base + " dbname=" + DB
    with psycopg.connect(own, autocommit=True) as c:
        c.execute("CREATE EXTENSION pg_idem")
        c.execute("CREATE TABLE effects (k text, generation bigint, note text)")
    yield own
    with psycopg.connect(base, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB)


@pytest.fixture
def db(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c
