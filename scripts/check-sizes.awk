# The function-length rule of scripts/check-sizes.sh (awk -v f=FILE -v max=LINES).
# Functions: a line whose code ends in "{" after a ")" (a definition's head, a member
# function in a class body, a lambda) starts one when none is open; it ends where the
# braces opened since close. Strings, characters and comments are blanked first.
function strip(s,   out, i, c, q, n) {
    out = ""; n = length(s); q = ""
    for (i = 1; i <= n; i++) {
        c = substr(s, i, 1)
        if (q != "") { if (c == "\\") { i++; continue } if (c == q) q = ""; continue }
        if (c == "\"" || c == "'") { q = c; continue }
        if (c == "/" && substr(s, i + 1, 1) == "/") break
        out = out c
    }
    return out
}
{
    line = $0
    if (incomment) { if (index(line, "*/")) { line = substr(line, index(line, "*/") + 2); incomment = 0 } else next }
    while (match(line, /\/\*/)) {
        rest = substr(line, RSTART + 2)
        if (index(rest, "*/")) line = substr(line, 1, RSTART - 1) substr(rest, index(rest, "*/") + 2)
        else { line = substr(line, 1, RSTART - 1); incomment = 1; break }
    }
    code = strip(line)
    if (code ~ /^[[:space:]]*#/) next
    if (!infn) {
        if (code ~ /\([^;]*$/ && !cand && code !~ /^[[:space:]]*(namespace|struct|class|enum|union|if|for|while|switch|return|else)\b/) { cand = NR; name = $0 }
        if (code ~ /;[[:space:]]*$/) cand = 0
        if (code ~ /\)[^;{}()]*\{[[:space:]]*$/ && code !~ /^[[:space:]]*(if|for|while|switch|else|do|namespace|struct|class|enum)\b/) {
            infn = 1; start = cand ? cand : NR; fname = cand ? name : $0; depth = 0; cand = 0
        } else if (code ~ /\{/ ) cand = 0
    }
    if (infn) {
        o = gsub(/\{/, "{", code); c = gsub(/\}/, "}", code)
        depth += o - c
        if (depth <= 0) {
            if (NR - start + 1 > max) { printf "check-sizes: %s:%d: a function of %d lines (at most %d): %s\n", f, start, NR - start + 1, max, fname > "/dev/stderr"; bad = 1 }
            infn = 0
        }
    }
}
END { exit bad }
