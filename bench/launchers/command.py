"""The general launcher: any command line from the experiment file (launch.command)."""

from bench.launchers import LAUNCHERS, Launcher

LAUNCHERS.register(
    "command",
    "any engine: launch.command with {port} and a {NAME} placeholder per setting",
    Launcher(command=()),
)
