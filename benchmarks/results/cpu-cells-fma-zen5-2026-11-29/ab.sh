# bash ab.sh LIB_A LIB_B OUT PAIRS: rows.py under LIB_A, then LIB_B, PAIRS times; a line a process in OUT
here=$(dirname "$0")
for i in $(seq 1 "$4"); do
  for lib in "$1" "$2"; do PYROUNDLIB_LIBRARY=$lib python3 "$here/rows.py" 5 | sed "s|^|$lib |" >> "$3"; done
done
