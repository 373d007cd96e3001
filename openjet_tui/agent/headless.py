"""`openjet run "TASK"`: one task without the full-screen app, printing progress or JSON Lines events.

Exit codes: 0 the task finished; 1 the turn failed or stopped early; 2 bad options or settings (an API key the
server rejects included); 3 the model server cannot be used (unreachable, no tool calls, window too small,
airgapped), whether probing finds it before the turn or a request fails mid-turn; 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path

from openjet_tui.agent import events as ev
from openjet_tui.agent.approver import Approver, ConsoleApprover, PolicyApprover
from openjet_tui.agent.context import build_system_prompt, load_agents_md
from openjet_tui.agent.loop import Agent, AgentConfig, TurnResult
from openjet_tui.agent.printer import HumanPrinter, JsonPrinter
from openjet_tui.agent.sessions import SessionInfo, SessionStore
from openjet_tui.agent.shellpolicy import Mode, ShellPolicy
from openjet_tui.agent.slipstream import Slipstream, check_slipstream_allowed
from openjet_tui.agent.tools import all_tools
from openjet_tui.agent.workspace import Workspace
from openjet_tui.config import Settings, load_settings
from openjet_tui.errors import (AirgappedError, ConfigError, LLMConnectionError, ProviderError,
                                ServerCapabilityError, SessionError, WorkspaceError)
from openjet_tui.llm.client import ChatClient
from openjet_tui.llm.network import NetworkGuard
from openjet_tui.llm.probe import probe_server
from openjet_tui.llm.providers import PROVIDERS, Endpoint, resolve_endpoint

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SERVER, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
USAGE_ERRORS = (ConfigError, ProviderError, SessionError, WorkspaceError)
SERVER_ERRORS = (ServerCapabilityError, LLMConnectionError, AirgappedError)


def add_agent_options(parser: argparse.ArgumentParser, is_subcommand: bool = False) -> None:
    """Options shared by `openjet` (the app) and `openjet run`. On a subcommand they default to absent, so
    `openjet --mode auto run TASK` keeps the mode given before the subcommand name."""
    unset = {"default": argparse.SUPPRESS} if is_subcommand else {}
    parser.add_argument("--provider", choices=list(PROVIDERS), help="model server kind (default: from settings)",
                        **unset)
    parser.add_argument("--base-url", help="server base URL, e.g. http://127.0.0.1:8080/v1", **unset)
    parser.add_argument("--model", help="model name to request", **unset)
    parser.add_argument("--mode", choices=[m.value for m in Mode], help="approval mode", **unset)
    parser.add_argument("--workspace", type=Path, help="project folder (default: the current folder)", **unset)
    parser.add_argument("--slipstream", action="store_true",
                        help="let a cloud model plan and review while the local model works", **unset)
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument("--continue", dest="continue_session", action="store_true",
                        help="continue the latest session of this workspace", **unset)
    resume.add_argument("--resume", metavar="ID", help="resume the session with this id", **unset)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`openjet run` arguments."""
    parser.add_argument("task", help="what the agent should do")
    add_agent_options(parser, is_subcommand=True)
    parser.add_argument("--json", action="store_true", help="print JSON Lines events instead of text")
    parser.add_argument("--temperature", type=float, help="sampling temperature sent with every request "
                        "(0: greedy, the same reply on every run; default: [sampling] setting, else the server's)")
    parser.add_argument("--seed", type=int, help="sampling seed sent with every request")


def run(args: argparse.Namespace) -> int:
    """Run the task; returns the exit code."""
    printer = JsonPrinter(sys.stdout) if args.json else HumanPrinter(sys.stdout, sys.stderr)
    try:
        return asyncio.run(run_task(args, printer))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except USAGE_ERRORS as exc:
        printer(ev.ErrorEvent(str(exc), type(exc).__name__))
        return EXIT_USAGE
    except SERVER_ERRORS as exc:
        printer(ev.ErrorEvent(str(exc), type(exc).__name__))
        return EXIT_SERVER


@dataclass(slots=True)
class Setup:
    """Everything resolved before the first request."""

    settings: Settings
    workspace: Workspace
    store: SessionStore
    session: SessionInfo | None  # None: a new session, created once the server is known to work
    is_resumed: bool


def resolve_setup(args: argparse.Namespace) -> Setup:
    """Settings, workspace and session from the options (the resumed session's workspace unless given)."""
    store = SessionStore()
    session = None
    if args.resume:
        session = store.get(args.resume)
    root = args.workspace or (Path(session.workspace) if session else Path.cwd())
    workspace = Workspace(root)
    if args.continue_session:
        session = store.latest(workspace.root)
        if session is None:
            raise SessionError(f"no session to continue in {workspace.root}; start one with `openjet run`")
    overrides = {"provider": args.provider, "base_url": args.base_url, "model": args.model, "mode": args.mode}
    if args.slipstream:
        overrides["slipstream"] = {"enabled": True}
    # Only `openjet run` has these options; the app's namespace lacks them and keeps the settings' values.
    sampling = {name: value for name in ("temperature", "seed") if (value := getattr(args, name, None)) is not None}
    if sampling:
        overrides["sampling"] = sampling
    settings = load_settings(workspace.root, overrides).settings
    return Setup(settings, workspace, store, session, session is not None)


NO_TERMINAL = {
    Mode.READ_ONLY: ("read-only mode needs a person to approve reading outside the workspace, and there is no "
                     "terminal"),
    Mode.ASK: ("ask mode needs a person to approve and there is no terminal; rerun in a terminal, or "
               "choose --mode auto-edit (edits apply) or --mode auto (commands run too)"),
    Mode.AUTO_EDIT: ("auto-edit mode needs a person to approve commands no allow rule covers, and there "
                     "is no terminal; add a [shell] allow rule or choose --mode auto"),
    Mode.AUTO: ("this needs a person's approval even in auto mode (a path outside the workspace, or a "
                "command that cannot be checked), and there is no terminal"),
}


def pick_approver(mode: Mode) -> Approver:
    """A terminal asks the person; without one, everything needing approval is denied, saying why."""
    if sys.stdin.isatty():
        return ConsoleApprover()
    return PolicyApprover(NO_TERMINAL[mode])


async def run_task(args: argparse.Namespace, printer: HumanPrinter | JsonPrinter) -> int:
    """Resolve, probe, run one turn; map the outcome to an exit code."""
    setup = resolve_setup(args)
    settings, mode = setup.settings, Mode.parse(setup.settings.mode)
    guard = NetworkGuard(settings.airgapped)
    if settings.slipstream.enabled:  # refuse before anything connects anywhere
        check_slipstream_allowed(Endpoint("slipstream", settings.slipstream.base_url, settings.slipstream.model),
                                 settings.airgapped)
    endpoint = resolve_endpoint(settings.provider, settings.base_url, settings.model)
    guard.check(endpoint.base_url)
    client = ChatClient(endpoint, guard=guard, timeout_s=settings.request_timeout_s,
                        sampling=settings.sampling.request_fields())
    slipstream: Slipstream | None = None
    try:
        window = await _probe(client, setup, mode, printer)
        if window is None:
            return EXIT_SERVER
        approver = pick_approver(mode)
        if isinstance(approver, PolicyApprover) and mode in (Mode.ASK, Mode.READ_ONLY):
            printer(ev.Notice(f"{mode.value} mode without a terminal: anything that needs approval will be "
                              "denied; use --mode auto-edit or --mode auto to let it act", "warning"))
        config = AgentConfig(mode=mode, max_steps=settings.max_steps, context_window=window or None,
                             compact_share=settings.context.compact_at,
                             keep_recent_turns=settings.context.keep_recent_turns,
                             shell_timeout_s=settings.shell.timeout_s,
                             max_output_bytes=settings.shell.max_output_bytes)
        if setup.session is None:
            setup.session = setup.store.create(setup.workspace.root, endpoint.provider, endpoint.model, mode.value)
        policy = ShellPolicy(settings.shell.allow, settings.shell.deny, setup.store.rules(setup.workspace.root))
        agent, slipstream = _build_agent(client, setup, approver, config, policy, printer)
        if setup.is_resumed:
            agent.resume()
        result = await agent.run_turn(args.task)
    finally:
        if slipstream is not None:
            await slipstream.aclose()
        await client.aclose()
        setup.store.close()
    return exit_code(result)


def exit_code(result: TurnResult) -> int:
    """The documented code for how a turn ended: a server that turns out unusable mid-turn (no tool calls, window
    too small, gone) is 3, as it is when the probe finds it so."""
    if result.status == "error" and isinstance(result.failure, SERVER_ERRORS):
        return EXIT_SERVER
    if result.status == "error" and isinstance(result.failure, USAGE_ERRORS):
        return EXIT_USAGE
    return {"done": EXIT_OK, "cancelled": EXIT_INTERRUPTED}.get(result.status, EXIT_FAILED)


async def _probe(client: ChatClient, setup: Setup, mode: Mode,
                 printer: HumanPrinter | JsonPrinter) -> int | None:
    """Check the server can serve this agent; returns the context window (0 if unknown), None if unusable."""
    system = build_system_prompt(setup.workspace.root, mode, load_agents_md(setup.workspace.root))
    report = await probe_server(client, system, [t.schema() for t in all_tools().values()])
    for note in report.notes:
        printer(ev.Notice(note))
    if not report.is_usable:
        for problem in report.problems:
            printer(ev.ErrorEvent(f"{client.endpoint.provider} at {client.endpoint.base_url}: {problem}",
                                  "ServerCapabilityError"))
        return None
    return report.context_window or setup.settings.context.window or 0


def _build_agent(client: ChatClient, setup: Setup, approver: Approver, config: AgentConfig, policy: ShellPolicy,
                 printer: HumanPrinter | JsonPrinter) -> tuple[Agent, Slipstream | None]:
    """The plain agent, or Slipstream's orchestrator over the local client."""
    settings = setup.settings
    if not settings.slipstream.enabled:
        return Agent(client, setup.workspace, approver, config=config, policy=policy, store=setup.store,
                     session=setup.session, on_event=printer), None
    endpoint = resolve_endpoint("slipstream", settings.slipstream.base_url, settings.slipstream.model)
    slipstream = Slipstream.create(endpoint, client, airgapped=settings.airgapped,
                                   timeout_s=settings.request_timeout_s)
    printer(ev.Notice(f"Slipstream is on: planning and review go to {endpoint.base_url} ({endpoint.model})",
                      "warning"))
    agent = slipstream.build_agent(setup.workspace, approver, config, policy=policy, store=setup.store,
                                   session=setup.session, on_event=printer)
    return agent, slipstream
