#!/bin/sh
# A scorer for rlft's `command` reward: one JSON object per line on stdin
# ({"prompt", "completion", "ground_truth", "metadata"}), one number per line on stdout.
# Scores 1 when the completion is nothing but a number (no words around the answer), else 0.
# POSIX sh only, so that it runs wherever rlft does; a scorer of your own can be any program.
while IFS= read -r line; do
  completion=${line#*\"completion\":\"}
  completion=${completion%%\"*}
  case "$completion" in
    ''|*[!0-9]*) echo 0 ;;
    *) echo 1 ;;
  esac
done
