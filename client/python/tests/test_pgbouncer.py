"""Behind PgBouncer in transaction mode (two server connections for many
clients): no session state, prepare_threshold=None, every mode works."""

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid

import psycopg
import pytest

from pg_idem import Config, Request, Response, Runner, SimplePool


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def bouncer(dsn):
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    params = dict(p.split("=", 1) for p in dsn.split())
    d = tempfile.mkdtemp(prefix="pg_idem.bouncer.")
    port = free_port()
    with open(os.path.join(d, "pgbouncer.ini"), "w") as f:
        f.write("[databases]\n")
        f.write("%s = host=%s port=%s dbname=%s user=%s\n" % (params["dbname"], params["host"], params["port"],
                                                             params["dbname"], params.get("user", "postgres")))
        f.write("[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = %d\nunix_socket_dir =\n"
                "auth_type = any\npool_mode = transaction\ndefault_pool_size = 2\nmax_client_conn = 100\n"
                "logfile = %s/pgbouncer.log\npidfile = %s/pgbouncer.pid\n" % (port, d, d))
    proc = subprocess.Popen([binary, os.path.join(d, "pgbouncer.ini")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    url = "host=127.0.0.1 port=%d dbname=%s user=%s" % (port, params["dbname"], params.get("user", "postgres"))
    for _ in range(100):
        try:
            psycopg.connect(url, connect_timeout=1).close()
            break
        except psycopg.OperationalError:
            if proc.poll() is not None:
                pytest.fail("pgbouncer did not start: %s" % proc.stderr.read().decode())
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(d, ignore_errors=True)


def req(k, target="/bouncer"):
    return Request("alice", "POST", target, [k], b"{}")


def test_every_mode_behind_a_transaction_pooler(bouncer, db):
    pool = SimplePool(bouncer, prepare_threshold=None)
    # Behind a transaction pooler with fewer server connections (2) than
    # waiting followers (9), a server-side wait would hold every connection
    # the winner needs to renew its lease: followers poll there. Renewed every
    # 0.1 s, the 1 s lease has 0.9 s of slack for a renewal waiting its turn.
    runner = Runner(pool, Config(lease=1.0, renew_interval=0.1, follower_wait_budget=10, server_wait=False))
    k = str(uuid.uuid4())
    runs, results = [], [None] * 10

    def handler(claim):
        runs.append(1)
        time.sleep(2.0)  # two leases, each renewal on whichever server connection is free
        return Response(201, [], b"bounced")
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, runner.run(req(k), handler)))
               for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(runs) == 1 and sum(r.replayed for r in results) == 9
    assert not any(r.lease_stolen for r in results)

    for mode in ("run_fenced", "run_in_transaction"):
        k2 = str(uuid.uuid4())

        def pay(tx, claim, k2=k2):
            tx.execute("INSERT INTO effects VALUES (%s, %s, 'bouncer')", (k2, claim.generation))
            return Response(201, [], b"paid")
        for _ in range(8):  # past psycopg's prepare threshold of 5
            r = getattr(runner, mode)(req(k2), pay)
            assert r.response.status == 201
        assert db.execute("SELECT count(*) FROM effects WHERE k = %s", (k2,)).fetchone()[0] == 1
    pool.close()


def test_the_dsn_defaults_work_behind_a_transaction_pooler(bouncer):
    """Issue 22: no prepare_threshold, no server_wait=False: a runner made
    from the dsn alone. 10 duplicates share 2 server connections while the
    followers wait in the server (in slices that free the connection), and
    the winner still stores its result; past psycopg's prepare threshold
    nothing is prepared."""
    import asyncio

    from pg_idem.aio import AsyncRunner

    runner = Runner(bouncer)
    k = str(uuid.uuid4())
    runs, results = [], [None] * 10

    def handler(claim):
        runs.append(1)
        time.sleep(0.3)
        return Response(201, [], b"pooled")
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, runner.run(req(k, "/dsn"), handler)))
               for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(runs) == 1, [r.response.status for r in results]
    assert [r.response.status for r in results] == [201] * 10
    for _ in range(8):  # past psycopg's prepare threshold of 5, on whichever server session
        assert runner.run(req(str(uuid.uuid4()), "/dsn"), handler).response.status == 201

    async def storm():
        arunner = AsyncRunner(bouncer)
        ak, aruns = str(uuid.uuid4()), []

        async def ahandler(claim):
            aruns.append(1)
            await asyncio.sleep(0.3)
            return Response(201, [], b"pooled")
        got = await asyncio.gather(*(arunner.run(req(ak, "/adsn"), ahandler) for _ in range(10)))
        return aruns, [r.response.status for r in got]
    aruns, statuses = asyncio.run(storm())
    assert len(aruns) == 1 and statuses == [201] * 10


def test_a_pool_that_prepares_recovers_behind_a_pooler(bouncer):
    """An application's own pool with psycopg's default prepare_threshold:
    a prepared-statement error from the pooler (26000 / 42P05) is answered by
    sending that statement again unprepared, and that connection prepares
    nothing from then on."""
    pools = [SimplePool(bouncer, max_size=1) for _ in range(3)]  # default prepare_threshold (5)
    runners = [Runner(p) for p in pools]
    statuses = []
    for i in range(12):  # each connection past the threshold, interleaved on 2 server sessions
        for r in runners:
            statuses.append(r.run(req(str(uuid.uuid4()), "/prepares"),
                                  lambda claim: Response(201, [], b"ok")).response.status)
    assert statuses == [201] * 36
    for p in pools:
        p.close()


def test_a_pooler_is_told_apart_from_the_server(bouncer, dsn):
    """Straight to the server the dsn= pool's connections keep psycopg's
    prepared statements (today's speed); behind the pooler, whose backend
    key is its own, they prepare nothing."""
    direct, pooled = Runner(dsn), Runner(bouncer)
    for r in (direct, pooled):
        assert r.run(req(str(uuid.uuid4()), "/tell"), lambda claim: Response(201)).response.status == 201
    (d,), (p,) = direct.pool._idle, pooled.pool._idle
    assert d.prepare_threshold == 5 and p.prepare_threshold is None
