#!/bin/sh
# A scripted agent with no memory: it only ever runs `longrun next --json` and does what it says.
#
#   STORE, TASK  the session's store and task id; PYTHON reads the JSON; `longrun` is on PATH.
#
# who=agent: run the commands in order, in cwd (stop at the first that fails), then ask again;
# who=time: sleep retry_after_s, then ask again; who=operator: exit 10 (a person must act);
# who=nobody: exit 0 if the task is finished, else 4.
while :; do
  advice=$(longrun next "$STORE" "$TASK" --json)
  fields=$(printf '%s' "$advice" | "${PYTHON:-python3}" -c '
import json, shlex, sys
advice = json.load(sys.stdin)
print("who=" + shlex.quote(advice["who"]))
print("kind=" + shlex.quote(advice["kind"]))
print("pause=" + shlex.quote(str(advice["retry_after_s"] or 0)))
print("workdir=" + shlex.quote(advice["cwd"] or "."))
print("commands=" + shlex.quote("\n".join(shlex.join(command) for command in advice["commands"])))
') || exit 5
  eval "$fields"
  case "$who" in
    agent)
      cd "$workdir" || exit 6
      printf '%s\n' "$commands" | while IFS= read -r command; do
        eval "$command" || break
      done
      ;;
    time) sleep "$pause" ;;
    operator) exit 10 ;;
    nobody) if [ "$kind" = finished ]; then exit 0; else exit 4; fi ;;
    *) exit 7 ;;
  esac
done
