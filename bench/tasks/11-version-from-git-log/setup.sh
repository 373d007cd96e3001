#!/usr/bin/env bash
# Builds the history the task asks about, on top of the harness's "Initial import" commit.
set -eu

commit() {
    GIT_AUTHOR_DATE="$1" GIT_COMMITTER_DATE="$1" git commit -q --allow-empty -m "$2"
}

commit "2024-03-02T10:00:00+00:00" "Release 1.7.0"
printf '\nHeader names are case-insensitive: `Subject` and `subject` are the same header.\n' >> docs/usage.md
git add docs/usage.md
commit "2024-04-11T09:30:00+00:00" "Document case-insensitive header names"
commit "2024-05-20T16:05:00+00:00" "Release 1.8.0"
printf '\nRun `python -m mailparse --version` to see the installed version.\n' >> docs/usage.md
git add docs/usage.md
commit "2024-06-03T11:12:00+00:00" "Mention --version in the usage notes"
commit "2024-06-28T08:45:00+00:00" "Release 1.8.1"
printf '\nA 2.0 rewrite with a streaming parser is being planned.\n' >> docs/usage.md
git add docs/usage.md
commit "2024-07-15T14:20:00+00:00" "Start planning the 2.0 streaming parser"
