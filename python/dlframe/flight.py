"""``dlframe.flight``: a Flight SQL query as a source of :func:`dlframe.batches`, read by many
processes at once.

A server that answers with several endpoints (``dlframe serve --partitioned``: one per
partition of the query's plan) lets N readers fetch disjoint parts of one result in parallel:
``shard=(rank, world)`` takes endpoints ``rank, rank + world, ...`` and fetches only those.
Rows keep the server's order within an endpoint; the endpoints of one shard come in order.
"""

from __future__ import annotations

from typing import Any, Iterator

__all__ = ["query", "FlightQuery"]

_COMMAND = b"type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery"


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    n, size = len(payload), bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        size.append(byte | (0x80 if n else 0))
        if not n:
            break
    return bytes([number << 3 | 2]) + bytes(size) + payload


def statement_command(sql: str) -> bytes:
    """A Flight SQL ``CommandStatementQuery`` in ``google.protobuf.Any``: the descriptor's bytes
    that a Flight SQL server runs as a statement (pyarrow.flight has no Flight SQL client)."""
    return _field(1, _COMMAND) + _field(2, _field(1, sql.encode()))


class FlightQuery:
    """One Flight SQL query on one server, as a source of :func:`dlframe.batches`: called, it
    asks the server for the query's endpoints (a fresh GetFlightInfo each pass) and yields one
    ``pyarrow.RecordBatchReader`` per endpoint of its shard, fetched as they are read. It holds
    no connection, so it can be pickled into DataLoader worker processes.

    ``location`` is the server's URI (``grpc://`` or ``grpc+tls://``), ``token`` its bearer
    token, ``tls_root_certs`` the PEM certificates to trust for TLS, ``timeout`` the seconds
    each call may take. ``shard=(rank, world)`` reads only endpoints ``rank, rank + world,
    ...`` of the result, so ``world`` readers share one result without reading a row twice;
    with one endpoint (a server that is not partitioned) rank 0 reads it all and the others
    read nothing. Nothing is sent until the batches are iterated. Needs pyarrow with Flight.
    """

    def __init__(
        self,
        location: str,
        sql: str,
        *,
        token: str | None = None,
        shard: tuple[int, int] | None = None,
        tls_root_certs: bytes | None = None,
        timeout: float | None = None,
    ) -> None:
        if not isinstance(location, str) or "://" not in location:
            raise ValueError(f"location must be a URI such as 'grpc://127.0.0.1:50051', not {location!r}")
        if not isinstance(sql, str):
            raise TypeError(f"sql must be a str, not {type(sql).__name__}")
        if shard is not None:
            ok = (
                isinstance(shard, tuple)
                and len(shard) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in shard)
                and shard[1] >= 1
                and 0 <= shard[0] < shard[1]
            )
            if not ok:
                raise ValueError(f"shard must be (rank, world) with 0 <= rank < world, not {shard!r}")
        self.location = location
        self.sql = sql
        self.token = token
        self.shard = shard or (0, 1)
        self.tls_root_certs = tls_root_certs
        self.timeout = timeout

    def _client(self) -> tuple[Any, Any]:
        import pyarrow.flight as fl

        kwargs = {"tls_root_certs": self.tls_root_certs} if self.tls_root_certs else {}
        client = fl.FlightClient(self.location, **kwargs)
        headers = [(b"authorization", f"Bearer {self.token}".encode())] if self.token else []
        return client, fl.FlightCallOptions(headers=headers, timeout=self.timeout)

    def endpoints(self) -> list[Any]:
        """The endpoints of this shard, in the server's order: ``rank, rank + world, ...``."""
        import pyarrow.flight as fl

        client, options = self._client()
        try:
            info = client.get_flight_info(fl.FlightDescriptor.for_command(statement_command(self.sql)), options)
        finally:
            client.close()
        rank, world = self.shard
        return list(info.endpoints)[rank::world]

    def __call__(self) -> Iterator[Any]:
        endpoints = self.endpoints()

        def readers() -> Iterator[Any]:
            client, options = self._client()
            try:
                for endpoint in endpoints:
                    yield client.do_get(endpoint.ticket, options).to_reader()
            finally:
                client.close()

        return readers()

    def __repr__(self) -> str:
        return f"dlframe.flight.query({self.location!r}, {self.sql!r}, shard={self.shard})"


query = FlightQuery
"""``dlframe.flight.query(location, sql, *, token=None, shard=None, tls_root_certs=None,
timeout=None)``: a Flight SQL query for :func:`dlframe.batches`, as
``dlframe.batches(dlframe.flight.query("grpc://host:50051", sql, shard=(rank, world)), n)``."""
