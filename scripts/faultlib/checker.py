"""The checker: lost messages, duplicates and their causes, and recovery times, from the clients'
histories and the cluster's fault timeline."""

import os

from .history import read_history


def check(cluster):
    """Lost, duplicates (and why), recovery times, from the histories and the fault timeline."""
    pubs = [e for e in cluster.events("producer-") if e["ev"] == "pub"]
    acked = {str(e["seq"]) for e in pubs if e["ok"]}
    failed = len(pubs) - len(acked)
    consumer_events = sorted(cluster.events("consumer-"), key=lambda e: e["t"])
    deliveries = {}
    unanswered = {}  # (mid, who) -> its latest delivery, until the FIN or REQ that answers it
    for e in consumer_events:
        if not e.get("seq", "").isdigit():
            continue  # a probe's body (full_disk), not one of the producer's
        if e["ev"] == "msg":
            deliveries.setdefault(e["seq"], []).append(e)
            unanswered[(e["mid"], e["who"])] = e
        elif e["ev"] in ("fin", "req"):
            delivery = unanswered.pop((e["mid"], e["who"]), None)
            if delivery is not None:
                delivery["answer"] = e
    lost = sorted(acked - set(deliveries), key=int)
    dup_reasons = {}
    dup_first = {}  # consumer -> duplicates whose earlier delivery it had
    duplicates = 0
    for seq, ds in deliveries.items():
        for before, after in zip(ds, ds[1:]):
            answer = before.get("answer")
            if before["mid"] != after["mid"]:
                why = "published twice (a retry after a lost answer)"
            elif answer is not None and answer["ev"] == "req":
                continue  # asked for: not a duplicate
            elif after["att"] > before["att"]:
                if answer is not None and answer["ok"]:
                    why = "timeout (its FIN was lost)"
                elif answer is not None:
                    why = "timeout (FIN failed: connection gone)"
                else:
                    why = "redelivered unanswered (timeout, or requeued by a closing consumer)"
            else:
                why = "redelivered after a restart (attempts not advanced)"
            duplicates += 1
            dup_reasons[why] = dup_reasons.get(why, 0) + 1
            dup_first[before["who"]] = dup_first.get(before["who"], 0) + 1
    result = {
        "published": len(pubs), "acked": len(acked), "pub_failed": failed, "delivered": len(deliveries),
        "lost": len(lost), "lost_sample": lost[:10], "duplicates": duplicates, "dup_reasons": dup_reasons, "dup_first": dup_first,
        "timeline": [(round(t, 3), w) for t, w in cluster.timeline],
    }
    result.update(recovery(cluster, pubs, consumer_events))
    lines = archived(cluster.dir)
    if lines is not None:
        # nsq_to_file's files hold bodies only: no message ID, no attempts, so a body written twice
        # cannot be told apart (a redelivery, a producer's retry); they are counted, not classified.
        bodies = [line for line in lines if line.isdigit()]
        missing = sorted(acked - set(bodies), key=int)
        result["archive"] = {"lines": len(bodies), "lost": len(missing), "lost_sample": missing[:10],
                             "repeated": len(bodies) - len(set(bodies))}
    return result


def archived(workdir):
    """The lines (bodies) Go's nsq_to_file wrote under ``workdir``'s ``archive-<host>/`` directories,
    a line not yet ended left out; None when no archiver ran."""
    dirs = [os.path.join(workdir, d) for d in sorted(os.listdir(workdir)) if d.startswith("archive-")]
    if not dirs:
        return None
    lines = []
    for d in dirs:
        for name in sorted(os.listdir(d)):
            try:
                with open(os.path.join(d, name), "rb") as f:
                    data = f.read()
            except OSError:
                continue  # moved from the work directory meanwhile (it is the same directory here)
            lines += data.decode("utf-8", "replace").split("\n")[:-1]
    return lines


def _first_after(times, t0):
    later = [t for t in times if t >= t0]
    return round(min(later) - t0, 2) if later else None


def recovery(cluster, pubs, consumer_events):
    """Times measured from the faults: producers answered again, consumers flowing again, a broker
    registered again with lookupd (a new connection: its remote address changed)."""
    out = {}
    faults = [(t, w) for t, w in cluster.timeline if w.startswith(("cut", "kill", "stop", "fill"))]
    heals = [(t, w) for t, w in cluster.timeline if w.startswith(("heal", "restart", "cont", "free"))]
    if not faults:
        return out
    t_fault = faults[0][0]
    acks = sorted(e["t"] for e in pubs if e["ok"])
    # the longest wait for an answer from the fault on: a publish stuck on the lost node until failover
    stuck = [e["t"] - e["ts"] for e in pubs if e["ok"] and e["t"] >= t_fault]
    out["producer_failover_s"] = round(max(stuck), 2) if stuck else None
    gaps = [b - a for a, b in zip(acks, acks[1:]) if b >= t_fault]
    out["producer_max_gap_s"] = round(max(gaps), 2) if gaps else None
    msgs = [e["t"] for e in consumer_events if e["ev"] == "msg"]
    dgaps = [b - a for a, b in zip(msgs, msgs[1:]) if b >= t_fault]
    out["consumer_max_gap_s"] = round(max(dgaps), 2) if dgaps else None
    redelivered = [e["t"] for e in consumer_events if e["ev"] == "msg" and e["att"] > 1]
    out["first_redelivery_s"] = _first_after(redelivered, t_fault)
    watch = read_history(cluster.path("watch.jsonl"))
    if watch and heals:
        t_heal = heals[-1][0]
        broker = cluster.registration_host
        address = cluster.net.address(broker)
        before = [e for e in watch if e["ev"] == "nodes" and e["t"] < t_fault]
        remote0 = {n["remote"] for n in (before[-1]["nodes"] if before else []) if n["addr"] == address}
        listed_during = all(any(n["addr"] == address for n in e["nodes"])
                            for e in watch if e["ev"] == "nodes" and t_fault <= e["t"] < t_heal)
        again = [e["t"] for e in watch if e["ev"] == "nodes" and e["t"] >= t_heal
                 and any(n["addr"] == address and n["remote"] not in remote0 for n in e["nodes"])]
        out["reregistered_s"] = round(min(again) - t_heal, 2) if again else None
        out["listed_during_fault"] = listed_during
        t_gone = [e["t"] for e in watch if e["ev"] == "nodes" and t_fault <= e["t"]
                  and not any(n["addr"] == address for n in e["nodes"])]
        out["unlisted_after_s"] = round(min(t_gone) - t_fault, 2) if t_gone else None
    return out
