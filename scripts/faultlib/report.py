"""A scenario's result as one line, and the results as a markdown table (ours beside Go's)."""

from .scenarios import ORDER


def fmt_cell(r):
    if r is None:
        return "-"
    if "error" in r:
        return "error: %s" % r["error"][:80]
    if "skipped" in r:
        return "skipped: %s" % r["skipped"]
    parts = ["lost %d of %d acked" % (r["lost"], r["acked"]), "dup %d" % r["duplicates"]]
    if r.get("dup_reasons"):
        parts[-1] += " (%s)" % ", ".join("%d %s" % (n, why) for why, n in sorted(r["dup_reasons"].items()))
    for key, label in (("producer_failover_s", "longest publish %ss"), ("first_redelivery_s", "redelivered from %ss"),
                       ("consumer_max_gap_s", "delivery gap %ss"), ("reregistered_s", "re-registered %ss after heal"),
                       ("throughput_per_s", "%s msg/s acked"), ("consumer_errors", "%s consumer errors"),
                       ("full_disk_answer", "full: %s"), ("recovered", "accepting again after freeing: %s")):
        if r.get(key) is not None:
            parts.append(label % (r[key],))
    if "listed_during_fault" in r:
        parts.append("in /nodes throughout" if r["listed_during_fault"] else
                     "off /nodes %ss after cut" % r.get("unlisted_after_s"))
    if "consumer_on_b1_after_heal" in r:
        parts.append("consumer took from b1 after the heal" if r["consumer_on_b1_after_heal"]
                     else "consumer took nothing from b1 after the heal")
    if "short_stall_reconnects" in r:
        parts.append("%s reconnects for the 0.8 s stall" % r["short_stall_reconnects"])
    if "long_stall_redials" in r:
        parts.append("%s connections redialled for the long stall" % r["long_stall_redials"])
    if "long_stall_b1_again_s" in r:
        parts.append("c1 took from b1 again %ss after the long stall" % r["long_stall_b1_again_s"])
    if r.get("reset_back_s"):
        parts.append("all clients back %ss after each reset" % r["reset_back_s"])
    if r.get("c1_back_after_reset_s"):
        parts.append("c1 took from b1 again %ss after each reset" % r["c1_back_after_reset_s"])
    if r.get("pynsq_deliveries") is not None:
        parts.append("pynsq consumer took %s" % r["pynsq_deliveries"])
    if r.get("archive"):
        a = r["archive"]
        parts.append("Go nsq_to_file lost %d of %d acked, %d lines, %d bodies written more than once (not classified:"
                     " its files hold no IDs or attempts)" % (a["lost"], r["acked"], a["lines"], a["repeated"]))
    if "soak" in r:
        parts.append("RSS/threads/fds %s" % r["soak"])
    if "log_errors" in r:
        parts.append("%d log errors%s" % (r["log_errors"], (" (%s)" % " / ".join(r["log_error_lines"]))
                                          if r.get("log_error_lines") else ""))
    return "; ".join(parts)


def report(results):
    lines = ["| scenario | ours | Go 1.3 |", "|---|---|---|"]
    for scenario in ORDER:
        if scenario in results:
            row = results[scenario]
            lines.append("| %s | %s | %s |" % (scenario, fmt_cell(row.get("ours")), fmt_cell(row.get("go"))))
    return "\n".join(lines)
