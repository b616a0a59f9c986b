#!/bin/sh
# run_under_wine.sh PROGRAM.exe - runs a Windows test program (tests/c/abi_test.c built by
# MinGW-w64) under Wine, in a throwaway prefix, with no display; `make windows` calls it.
#
# Two failures are told apart:
#   - the program ran and failed (it printed "NAME: started", then a failed check, or it stopped
#     early): that is the result, reported with its exit status, never tried again;
#   - Wine did not start it (no such line): Wine's own messages (WINEDEBUG=-all keeps
#     them quiet in a good run) and the prefix's boot log are shown, and the program is run
#     again in a fresh prefix, at most three tries in all.
set -u
exe=$1
wine=${WINE:-wine}
case $exe in /*) ;; *) exe=$PWD/$exe ;; esac
unset DISPLAY
export WINEDLLOVERRIDES="mscoree,mshtml="
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for try in 1 2 3; do
  WINEPREFIX=$(mktemp -d) && export WINEPREFIX
  if [ "$try" -eq 1 ]; then export WINEDEBUG=-all; else unset WINEDEBUG; fi
  "$wine" wineboot --init > "$WINEPREFIX/wineboot.log" 2>&1
  boot=$?
  wineserver -w
  "$wine" "$exe" > "$out" 2>&1
  status=$?
  wineserver -w
  cat "$out"
  if grep -q "^[a-z_]*: started" "$out"; then
    rm -rf "$WINEPREFIX"
    [ "$status" -eq 0 ] || echo "run_under_wine: $(basename "$exe") exited with status $status"
    exit "$status"
  fi
  echo "run_under_wine: try $try: Wine did not start $(basename "$exe") (exit status $status;" \
       "wineboot exit status $boot); the prefix's boot log:"
  tail -n 20 "$WINEPREFIX/wineboot.log"
  rm -rf "$WINEPREFIX"
done
echo "run_under_wine: Wine could not start $(basename "$exe") in three tries"
exit 1
