"""Helpers of the command-line tests: parse a command line into Options, run the command in-process."""

from click.testing import CliRunner

from nsqd_threaded import cli


def options_for(*args):
    """Parse ``args`` as the command would and resolve them, without starting a broker."""
    ctx = cli.main.make_context("nsqd-threaded", list(args))
    return cli.resolve(ctx.params)


def invoke(*args):
    """Run the command in-process; ``output`` holds stdout and stderr."""
    return CliRunner().invoke(cli.main, list(args))
