"""The agent core: everything a coding agent does, with no UI. Front ends drive it through two seams.

    agent = Agent(client, Workspace(root), approver, config=AgentConfig(mode=Mode.ASK), policy=ShellPolicy(...),
                  store=SessionStore(), session=store.create(...), on_event=handle_event)
    result = await agent.run_turn("fix the failing test")   # cancel the task to stop it at once

- Events (agent/events.py): every event is a dataclass with `type` and `to_json()`; `on_event` receives them in
  order (text and reasoning deltas, tool requests, proposals, decisions, results, usage, engine stats, Slipstream
  traffic, notices, errors, turn start and finish).
- Approver (agent/approver.py): `review_edit(proposal) -> EditDecision`, `review_shell(request) -> ShellDecision`,
  `review_path(request) -> PathDecision`. The Textual UI implements it with inline prompts; headless runs use
  ConsoleApprover (a terminal) or PolicyApprover (none); tests use ScriptedApprover.

Also here: `agent.compact()`, `agent.undo()`, `agent.set_mode()`, `agent.resume()` (after an interrupted run),
WorkspaceWatcher and FileIndex (agent/watch.py) for stale proposals and `@path` completion, and Slipstream
(agent/slipstream.py) for the cloud orchestrator. This package never imports openjet_tui.ui or engine.
"""
