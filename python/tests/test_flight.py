"""`dlframe serve` (Arrow Flight SQL) with its real clients: the ADBC Flight SQL driver and
pyarrow.flight give the same tensor as `dlframe.to_dlpack(ctx.sql(...))` in this process; a
bad query, a refused token, and 8 client threads x 50 queries."""

import re
import threading

import datafusion
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import optional
from served import serve_table, statement_query

import dlframe
import dlframe.datafusion as dldf

TOKEN = "t0ken-for-tests"
ROWS = 3000


@pytest.fixture(scope="module")
def table_dir(tmp_path_factory):
    """A Parquet table of three files: id (int64), a (float32), b (int32), c (float64 with nulls)."""
    d = tmp_path_factory.mktemp("flight") / "t"
    d.mkdir()
    rng = np.random.default_rng(7)
    for k, (lo, hi) in enumerate([(0, 1000), (1000, 2200), (2200, ROWS)]):
        ids = np.arange(lo, hi, dtype=np.int64)
        c = pa.array(rng.normal(size=hi - lo), mask=(ids % 11 == 0))
        pq.write_table(
            pa.table({"id": ids, "a": rng.normal(size=hi - lo).astype(np.float32), "b": (ids * 3).astype(np.int32), "c": c}),
            d / f"part-{k}.parquet",
        )
    return d


@pytest.fixture(scope="module")
def server(table_dir):
    yield from serve_table(table_dir, TOKEN)


def local(table_dir, sql):
    ctx = datafusion.SessionContext()
    dldf.register(ctx)
    ctx.register_parquet("t", str(table_dir))
    return np.from_dlpack(dlframe.to_dlpack(ctx.sql(sql)))


def adbc_connect(server, token=TOKEN):
    dbapi = optional("adbc_driver_flightsql.dbapi")
    kwargs = {"adbc.flight.sql.authorization_header": f"Bearer {token}"} if token else {}
    return dbapi.connect(server.uri, db_kwargs=kwargs, autocommit=True)


def adbc_table(server, sql, token=TOKEN):
    with adbc_connect(server, token) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetch_arrow_table()


def flight_table(server, sql, token=TOKEN):
    fl = optional("pyarrow.flight")
    client = fl.FlightClient(server.uri)
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    options = fl.FlightCallOptions(headers=headers, timeout=60)
    info = client.get_flight_info(fl.FlightDescriptor.for_command(statement_query(sql)), options)
    tables = [client.do_get(e.ticket, options).read_all() for e in info.endpoints]
    client.close()
    return pa.concat_tables(tables)


QUERY = "SELECT to_tensor_fill(0, a, b, c) AS x FROM t ORDER BY id"


@pytest.mark.parametrize("fetch", [adbc_table, flight_table], ids=["adbc", "pyarrow.flight"])
def test_a_served_tensor_equals_the_local_one(server, table_dir, fetch):
    result = fetch(server, QUERY)
    assert isinstance(result.schema.field("x").type, pa.FixedShapeTensorType), result.schema
    got = np.from_dlpack(dlframe.to_dlpack(result))
    want = local(table_dir, QUERY)
    assert got.shape == (ROWS, 3) and got.dtype == np.float64
    np.testing.assert_array_equal(got, want)


def test_one_result_batch_becomes_a_tensor_without_a_copy(server):
    result = adbc_table(server, "SELECT to_tensor(a, b) AS x FROM t WHERE id < 500 ORDER BY id")
    col = result.column("x")
    assert col.num_chunks == 1, "the small result should come as one batch"
    tensor = dlframe.to_dlpack(result, copy=False)
    values = col.chunk(0).storage.values
    assert np.from_dlpack(tensor).__array_interface__["data"][0] == values.buffers()[1].address
    assert np.from_dlpack(tensor).shape == (500, 2)


@pytest.mark.parametrize("fetch", [adbc_table, flight_table], ids=["adbc", "pyarrow.flight"])
def test_errors_carry_the_local_message_and_the_server_stays_up(server, table_dir, fetch):
    cases = {
        # The count is that of the first batch with nulls, which depends on the partitioning.
        "SELECT to_tensor(a, c) FROM t": r"column 'c' has \d+ null\(s\); fill them in the same pass",
        "SELECT to_tensor(a) FROM nope": r"table 'datafusion\.public\.nope' not found",
        "SELEC to_tensor(a) FROM t": r"Expected: an SQL statement, found: SELEC",
        "SELECT to_tensor(CAST(a AS VARCHAR)) FROM t": "strings and binary have no tensor form",
    }
    for sql, message in cases.items():
        with pytest.raises(Exception) as local_error:
            local(table_dir, sql)
        assert re.search(message, str(local_error.value)), (sql, str(local_error.value))
        with pytest.raises(Exception) as served_error:
            fetch(server, sql)
        assert re.search(message, str(served_error.value)), (sql, str(served_error.value))
    assert fetch(server, "SELECT count(*) AS n FROM t").column("n").to_pylist() == [ROWS]


def test_a_missing_or_wrong_token_is_refused(server):
    fl = optional("pyarrow.flight")
    adbc = optional("adbc_driver_manager")
    for token in [None, "wrong"]:
        with pytest.raises(adbc.Error, match="bearer token"):
            adbc_table(server, "SELECT 1 AS one", token=token)
        with pytest.raises(fl.FlightUnauthenticatedError, match="bearer token"):
            flight_table(server, "SELECT 1 AS one", token=token)


def test_eight_client_threads_fifty_queries_each(server):
    """Every thread has its own ADBC connection; each query's rows and values are checked."""
    ids = np.arange(ROWS)
    failures, counts = [], [0] * 8

    def client(k):
        try:
            with adbc_connect(server) as conn, conn.cursor() as cur:
                for q in range(50):
                    m = 2 + (k + q) % 7
                    cur.execute(f"SELECT to_tensor(id, b) AS x FROM t WHERE id % {m} = {q % m} ORDER BY id")
                    x = np.from_dlpack(dlframe.to_dlpack(cur.fetch_arrow_table()))
                    want = ids[ids % m == q % m]
                    assert x.shape == (len(want), 2), (k, q, x.shape)
                    np.testing.assert_array_equal(x[:, 0], want)
                    np.testing.assert_array_equal(x[:, 1], want * 3)
                    counts[k] += 1
        except Exception as e:  # collected and reported below, with the thread
            failures.append((k, repr(e)))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a client thread did not finish in 300 s"
    assert not failures, failures
    assert counts == [50] * 8
