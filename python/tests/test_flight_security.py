"""`dlframe serve` hardened, through its real clients (the ADBC Flight SQL driver and
pyarrow.flight): every statement that is not a query is refused as read-only on every route
(plain, unprepared, prepared, raw GetFlightInfo, DoPut update) and changes nothing; a path is not
a table; queries built to exhaust the stack or the CPU are refused by the server's limits and
leave it serving; errors name the user's mistake, not the server's files or Rust types; two
authorization headers and crafted tickets are refused."""

import random
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import optional
from served import serve_table, statement_query

TOKEN = "t0ken-for-security-tests"
ROWS = 1000
# Every RPC of these tests has a deadline: a hung server fails a test instead of stalling it.
TIMEOUT_S = 60


@pytest.fixture(scope="module")
def table_dir(tmp_path_factory):
    """A Parquet table of two files: id (int64), a (float64)."""
    d = tmp_path_factory.mktemp("flight-security") / "t"
    d.mkdir()
    for k, (lo, hi) in enumerate([(0, 400), (400, ROWS)]):
        ids = np.arange(lo, hi, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "a": ids * 0.5}), d / f"part-{k}.parquet")
    return d


@pytest.fixture(scope="module")
def server(table_dir):
    yield from serve_table(table_dir, TOKEN)


# ---------------------------------------------------------------------------------------------
# The clients


def adbc_connect(server, token=TOKEN):
    dbapi = optional("adbc_driver_flightsql.dbapi")
    kwargs = {
        "adbc.flight.sql.authorization_header": f"Bearer {token}",
        "adbc.flight.sql.rpc.timeout_seconds.query": str(TIMEOUT_S),
        "adbc.flight.sql.rpc.timeout_seconds.fetch": str(TIMEOUT_S),
        "adbc.flight.sql.rpc.timeout_seconds.update": str(TIMEOUT_S),
    }
    return dbapi.connect(server.uri, db_kwargs=kwargs, autocommit=True)


def adbc_table(server, sql):
    with adbc_connect(server) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetch_arrow_table()


def flight_options(fl, headers=None):
    if headers is None:
        headers = [(b"authorization", f"Bearer {TOKEN}".encode())]
    return fl.FlightCallOptions(headers=headers, timeout=TIMEOUT_S)


def descriptor(fl, sql):
    return fl.FlightDescriptor.for_command(statement_query(sql))


def flight_table(server, sql):
    fl = optional("pyarrow.flight")
    client = fl.FlightClient(server.uri)
    try:
        options = flight_options(fl)
        info = client.get_flight_info(descriptor(fl, sql), options)
        tables = [client.do_get(e.ticket, options).read_all() for e in info.endpoints]
    finally:
        client.close()
    return pa.concat_tables(tables)


def errors_of(fetch):
    """What a failed query raises: ADBC's Error; pyarrow.flight raises a FlightError for some
    gRPC codes and an ArrowException (ArrowInvalid, ArrowKeyError, ...) for the others."""
    if fetch is adbc_table:
        return optional("adbc_driver_manager").Error
    fl = optional("pyarrow.flight")
    return (fl.FlightError, pa.ArrowException)


def answers(server):
    """The server process is alive and answers a query."""
    assert server.proc.poll() is None, f"dlframe serve exited with {server.proc.poll()}; stderr: {server.errors}"
    assert flight_table(server, "SELECT 1 AS one").column("one").to_pylist() == [1]


# ---------------------------------------------------------------------------------------------
# Read-only: the routes a statement can take, each of which must refuse a non-query


def adbc_execute(server, sql):
    """DB-API execute (the driver prepares first when it can) and fetch."""
    with adbc_connect(server) as conn, conn.cursor() as cur:
        cur.execute(sql)
        cur.fetch_arrow_table()


def adbc_unprepared(server, sql):
    """The ADBC statement without a prepare: GetFlightInfo(CommandStatementQuery), then DoGet."""
    with adbc_connect(server) as conn, conn.cursor() as cur:
        stmt = cur.adbc_statement
        stmt.set_sql_query(sql)
        handle, _ = stmt.execute_query()
        pa.RecordBatchReader.from_stream(handle).read_all()


def adbc_prepared(server, sql):
    """An explicit prepared statement; the refusal may come at prepare or at execute."""
    with adbc_connect(server) as conn, conn.cursor() as cur:
        cur.adbc_prepare(sql)
        cur.execute(sql)
        cur.fetch_arrow_table()


def flight_info(server, sql):
    """pyarrow.flight's GetFlightInfo with a CommandStatementQuery made by hand."""
    fl = optional("pyarrow.flight")
    client = fl.FlightClient(server.uri)
    try:
        client.get_flight_info(descriptor(fl, sql), flight_options(fl))
    finally:
        client.close()


def adbc_update(server, sql):
    """DoPut(CommandStatementUpdate), the Flight SQL route for statements without a result."""
    with adbc_connect(server) as conn, conn.cursor() as cur:
        cur.executescript(sql)


ROUTES = [adbc_execute, adbc_unprepared, adbc_prepared, flight_info]
ROUTE_IDS = ["adbc-execute", "adbc-unprepared", "adbc-prepared", "pyarrow.flight"]

# `{out}` is the COPY target, a path in the test's tmp_path.
NOT_QUERIES = {
    "create-external-table": "CREATE EXTERNAL TABLE pw (line VARCHAR) STORED AS CSV LOCATION '/etc/passwd'",
    "create-table-as": "CREATE TABLE x AS SELECT 1 AS a",
    "copy": "COPY (SELECT 'x' AS a) TO '{out}' STORED AS CSV",
    "insert": "INSERT INTO t SELECT * FROM t",
    "drop": "DROP TABLE t",
    "create-view": "CREATE VIEW v AS SELECT 1 AS a",
    "set": "SET datafusion.execution.batch_size = 1",
}


def refusal(route):
    """What the route raises for a refused statement: PERMISSION_DENIED is pyarrow.flight's
    FlightUnauthorizedError; ADBC raises one of its Error classes."""
    if route is flight_info:
        return optional("pyarrow.flight").FlightUnauthorizedError
    return optional("adbc_driver_manager").Error


@pytest.mark.parametrize("name", list(NOT_QUERIES))
@pytest.mark.parametrize("route", ROUTES, ids=ROUTE_IDS)
def test_a_statement_that_is_not_a_query_is_refused_as_read_only(server, tmp_path, route, name):
    out = tmp_path / "out.csv"
    sql = NOT_QUERIES[name].format(out=out)
    with pytest.raises(refusal(route)) as refused:
        route(server, sql)
    assert "read-only" in str(refused.value), (sql, str(refused.value))
    assert not out.exists(), f"COPY wrote {out}"
    assert server.proc.poll() is None, server.errors


def table_names(conn):
    """(catalog, schema, table) of every table that the server lists, sorted."""
    objects = conn.adbc_get_objects(depth="tables").read_all().to_pylist()
    return sorted(
        (catalog["catalog_name"], schema["db_schema_name"], table["table_name"])
        for catalog in objects
        for schema in catalog["catalog_db_schemas"] or []
        for table in schema["db_schema_tables"] or []
    )


def test_the_refused_statements_change_nothing(server, table_dir, tmp_path):
    """Every statement on every route, the DoPut update route included; then the same tables,
    the same files, no COPY output, and the same rows seen from another connection."""
    out = tmp_path / "out.csv"
    files = sorted(p.name for p in table_dir.iterdir())
    with adbc_connect(server) as conn:
        tables = table_names(conn)
    assert "t" in [name for _, _, name in tables], tables
    assert adbc_table(server, "SELECT count(*) AS n FROM t").column("n").to_pylist() == [ROWS]

    fl = optional("pyarrow.flight")
    refused = (optional("adbc_driver_manager").Error, fl.FlightError, pa.ArrowException)
    ran = []
    for name, template in NOT_QUERIES.items():
        for route in [*ROUTES, adbc_update]:
            try:
                route(server, template.format(out=out))
            except refused:  # the refusal (its message is checked by the test above)
                continue
            ran.append((name, route.__name__))
    assert not ran, f"not refused: {ran}"
    assert server.proc.poll() is None, server.errors

    assert not out.exists(), f"COPY wrote {out}"
    assert sorted(p.name for p in table_dir.iterdir()) == files, "the table's directory changed"
    with adbc_connect(server) as conn:
        after = table_names(conn)
    assert after == tables, f"tables before {tables}, after {after}"
    assert not {"pw", "x", "v"} & {name for _, _, name in after}, after
    assert adbc_table(server, "SELECT count(*) AS n FROM t").column("n").to_pylist() == [ROWS]


@pytest.mark.parametrize("fetch", [adbc_table, flight_table], ids=["adbc", "pyarrow.flight"])
def test_a_path_is_not_a_table(server, fetch):
    with pytest.raises(errors_of(fetch)):
        fetch(server, "SELECT * FROM '/etc/passwd'")
    answers(server)


# ---------------------------------------------------------------------------------------------
# Crash probes: deep and long queries are answered (mostly refused by the limits), and the
# server lives on


def chained_ctes(n):
    ctes = ["c0 AS (SELECT 1 AS a)"] + [f"c{i} AS (SELECT a FROM c{i - 1})" for i in range(1, n)]
    return "WITH " + ", ".join(ctes) + f" SELECT a FROM c{n - 1}"


# name: (sql, the value it may return instead of an error, or None where it must be refused)
PROBES = {
    "sum-250": ("SELECT " + "+".join(["1"] * 250), 250),
    "sum-100000": ("SELECT " + "+".join(["1"] * 100_000), None),
    "and-10000": ("SELECT 1 WHERE " + " AND ".join(["1=1"] * 10_000), None),
    "union-all-3000": (" UNION ALL ".join(["SELECT 1 AS a"] * 3000), None),
    "ctes-1000": (chained_ctes(1000), None),
    "parentheses-10000": ("SELECT " + "(" * 10_000 + "1" + ")" * 10_000, None),
}
# The refusals of the limits: the server's depth and length limits ("nested too deeply", "too
# long"), its query-block limit ("too many query blocks"), and DataFusion's parser's own
# recursion limit on parentheses ("RecursionLimitExceeded").
LIMIT = re.compile(r"nested|too long|too deep|too many|recursion ?limit", re.IGNORECASE)


@pytest.mark.parametrize("name", list(PROBES))
def test_a_probe_is_answered_and_the_server_lives_on(server, name):
    fl = optional("pyarrow.flight")
    sql, value = PROBES[name]
    try:
        result = flight_table(server, sql)
    except (fl.FlightError, pa.ArrowException) as e:
        dead = (fl.FlightTimedOutError, fl.FlightUnavailableError)
        assert not isinstance(e, dead), f"{name}: no answer ({e!r}); stderr: {server.errors}"
        if value is None:
            assert LIMIT.search(str(e)), f"{name}: refused, but not by a limit: {e}"
    else:
        assert value is not None, f"{name} ran ({result.num_rows} rows) instead of being refused"
        assert result.column(0).to_pylist() == [value], (name, result)
    answers(server)


# ---------------------------------------------------------------------------------------------
# Errors are for people


@pytest.mark.parametrize("fetch", [adbc_table, flight_table], ids=["adbc", "pyarrow.flight"])
def test_an_error_names_the_mistake_not_the_server_internals(server, table_dir, fetch):
    with pytest.raises(errors_of(fetch)) as error:
        fetch(server, "SELECT nope FROM t")
    message = str(error.value)
    assert "nope" in message, message
    for leak in [str(table_dir), "ExternalError(", "DataFusionError", "Execution("]:
        assert leak not in message, (leak, message)


# ---------------------------------------------------------------------------------------------
# Authentication and tickets


def test_two_authorization_headers_are_refused(server):
    fl = optional("pyarrow.flight")
    right, wrong = f"Bearer {TOKEN}".encode(), b"Bearer wrong"
    client = fl.FlightClient(server.uri)
    try:
        info = client.get_flight_info(descriptor(fl, "SELECT 1 AS one"), flight_options(fl))
        for pair in [(right, right), (right, wrong), (wrong, right)]:
            options = flight_options(fl, [(b"authorization", v) for v in pair])
            with pytest.raises(fl.FlightUnauthenticatedError):
                client.get_flight_info(descriptor(fl, "SELECT 1 AS one"), options)
            with pytest.raises(fl.FlightUnauthenticatedError):
                client.do_get(info.endpoints[0].ticket, options).read_all()
    finally:
        client.close()
    answers(server)


def test_a_crafted_ticket_is_an_error_and_the_server_lives_on(server):
    fl = optional("pyarrow.flight")
    rng = random.Random(20240611)
    tickets = [rng.randbytes(n) for n in (1, 16, 64, 4096)]
    tickets.append(statement_query("DROP TABLE t"))
    client = fl.FlightClient(server.uri)
    try:
        for ticket in tickets:
            with pytest.raises((fl.FlightError, pa.ArrowException)):
                client.do_get(fl.Ticket(ticket), flight_options(fl)).read_all()
            assert server.proc.poll() is None, (ticket[:16], server.errors)
    finally:
        client.close()
    answers(server)
    assert flight_table(server, "SELECT count(*) AS n FROM t").column("n").to_pylist() == [ROWS]


# ---------------------------------------------------------------------------------------------
# Substrait: a plan made by datafusion-python runs; a malformed one is refused


def substrait_descriptor(fl, plan: bytes):
    """GetFlightInfo's descriptor for a Flight SQL CommandStatementSubstraitPlan."""
    from dlframe.flight import _field

    url = b"type.googleapis.com/arrow.flight.protocol.sql.CommandStatementSubstraitPlan"
    command = _field(1, _field(1, plan) + _field(2, b"0.63"))
    return fl.FlightDescriptor.for_command(_field(1, url) + _field(2, command))


def test_a_substrait_plan_runs_and_a_malformed_one_is_refused(server, table_dir):
    fl = optional("pyarrow.flight")
    substrait = optional("datafusion.substrait")
    datafusion = optional("datafusion")
    ctx = datafusion.SessionContext()
    ctx.register_parquet("t", str(table_dir))
    plan = substrait.Serde.serialize_bytes("SELECT id FROM t WHERE id < 10", ctx)
    client = fl.FlightClient(server.uri)
    try:
        options = flight_options(fl)
        info = client.get_flight_info(substrait_descriptor(fl, plan), options)
        got = pa.concat_tables([client.do_get(e.ticket, options).read_all() for e in info.endpoints])
        assert sorted(got.column("id").to_pylist()) == list(range(10))
        for bad in [b"\x0a\xff\xff\xff\xff\x0f", bytes(random.Random(7).randbytes(256)), b""]:
            with pytest.raises((fl.FlightError, pa.ArrowException)):
                client.get_flight_info(substrait_descriptor(fl, bad), options)
    finally:
        client.close()
    answers(server)
