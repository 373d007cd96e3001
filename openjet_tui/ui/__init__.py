"""The Textual app: `openjet` with no subcommand opens it (openjet_tui.ui.app.main)."""
