# ab_check_lib.sh: what the A/B script checks share (sourced by ab_table_check.sh, prebuilt_ab_check.sh).

# prefill_row SHAPE TOKENS TIME: a line of `gdp-bench ops --op prefill` (the time in its three columns)
prefill_row() {
    printf 'prefill  %-45s %7d %9.1f %9.1f %9.1f  1.0e+07    400.0    80.0     110.5   11.1   1250.0    1.25       0\n' \
        "$1" "$2" "$3" "$3" "$3"
}

# expect TEXT: TEXT must be a line part of $out (else fail=1 and a FAIL line)
fail=0
expect() { grep -qF -- "$1" <<<"$out" || { echo "FAIL: the output lacks: $1"; fail=1; }; }
