# Sourced by scripts/wan.sh and scripts/nat.sh (needs their `die`): link rates as tc takes them.
# "20M" / "20mbit" / "1.5G" / "800k" / "20000000" -> bits per second (integer).
rate_bps() {
  local r="${1,,}"
  r="${r%bit}"; r="${r%bps}"
  awk -v r="$r" 'BEGIN {
    m = 1; u = substr(r, length(r), 1)
    if (u == "k") { m = 1e3; r = substr(r, 1, length(r) - 1) }
    else if (u == "m") { m = 1e6; r = substr(r, 1, length(r) - 1) }
    else if (u == "g") { m = 1e9; r = substr(r, 1, length(r) - 1) }
    if (r !~ /^[0-9]+(\.[0-9]+)?$/) exit 1
    printf "%d\n", r * m }' || die "bad rate '$1' (use e.g. 20mbit, 20M, 1G, 800k)"
}
