"""`tokenbench serve`: the API and dashboard on uvicorn.

The web stack (server/, uvicorn) is imported only inside the command, when the service
starts; registering it imports only server/datafiles.py's size default (standard library only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bench.cli.options import DbOption
from server.datafiles import DEFAULT_MAX_FILE_MB

# Not 8000: that is vLLM's (and trtllm-serve's) default, where the endpoint under test runs.
DEFAULT_PORT = 8300


def serve_command(
    db: DbOption = None,
    host: Annotated[
        str,
        typer.Option(help="Address to listen on; beyond loopback, reads need the token too"),
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port to listen on (not vLLM's 8000)")
    ] = DEFAULT_PORT,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host",
            help="Host or CIDR network background runs may target (repeat); loopback always",
        ),
    ] = None,
    open_reads: Annotated[
        bool,
        typer.Option(
            "--open-reads",
            help="Serve reads without the token even when listening beyond loopback",
        ),
    ] = False,
    prices_file: Annotated[
        Path | None,
        typer.Option("--prices-file", help="Your prices YAML; tiers added via the API go here"),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help="The only folder scenarios sent to the API may read traces and datasets from "
            "(uploads via PUT /api/data/NAME land here); without it they read no files",
        ),
    ] = None,
    max_data_file_mb: Annotated[
        float, typer.Option("--max-data-file-mb", min=0, help="Size limit per data file")
    ] = DEFAULT_MAX_FILE_MB,
    server_name: Annotated[
        list[str] | None,
        typer.Option(
            "--server-name",
            help="A host name browsers reach the service by (repeat); IP addresses, localhost, "
            "this machine's hostname and --host are always accepted, other Host headers get 400",
        ),
    ] = None,
    upstream_key: Annotated[
        list[str] | None,
        typer.Option(
            "--upstream-key",
            help="HOST or HOST:PORT that jobs send $OPENAI_API_KEY to (repeat); to any other "
            "target, one a token holder names, the key is never sent",
        ),
    ] = None,
    log_level: Annotated[
        str, typer.Option("--log-level", help="uvicorn's: critical, error, warning, info, debug")
    ] = "info",
) -> None:
    """Serve the REST API (/api, /docs) and the dashboard comparing runs (B200 beside H100)."""
    import socket

    import uvicorn

    from bench.store import StoreError, resolve_url, safe_url_text
    from server.app import create_app
    from server.auth import TOKEN_ENV, is_loopback, resolve_token

    try:
        sock = listen(host, port)
    except OSError as exc:
        typer.echo(
            f"error: cannot listen on {host}:{port}: {exc.strerror or exc}"
            + ("; is another server on that port? Pick another with --port" if port else ""),
            err=True,
        )
        raise typer.Exit(2) from None
    port = sock.getsockname()[1]
    token, generated = resolve_token()
    reads_open = open_reads or is_loopback(host)
    try:
        app = create_app(
            db,
            api_token=token,
            allow_hosts=list(allow_host or []),
            upstream_key_hosts=list(upstream_key or []),
            open_reads=reads_open,
            prices_file=prices_file,
            data_dir=data_dir,
            max_data_file_mb=max_data_file_mb,
            server_names=[host, socket.gethostname(), *(server_name or [])],
        )
    except (StoreError, ValueError, OSError) as exc:
        sock.close()
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"tokenbench serving {safe_url_text(resolve_url(db))} on http://{shown}:{port}")
    if generated:
        typer.echo(f"API token (shown once; set ${TOKEN_ENV} to choose your own): {token}")
    else:
        typer.echo(f"API token: from ${TOKEN_ENV}")
    typer.echo("reads: open" if reads_open else "reads: need the token (--open-reads to open them)")
    typer.echo(f"background runs may target: {app.state.tb.allow.describe()}")
    typer.echo(f"$OPENAI_API_KEY is sent only to: {app.state.tb.keys.describe()}")
    folder = app.state.tb.data.root
    typer.echo(
        f"API scenarios may read files in: {folder}"
        if folder
        else "API scenarios may read no files (--data-dir DIR to allow a data folder)"
    )
    from server.jobs import yield_to_jobs

    yield_to_jobs(app.state.tb.jobs)  # readers of the service never slow a job's timing
    uvicorn.Server(uvicorn.Config(app, log_level=log_level)).run(sockets=[sock])


def listen(host: str, port: int):
    """The listening socket, bound before anything is printed: a busy port is one line,
    not a banner followed by uvicorn's error."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=2048)
