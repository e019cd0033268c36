import os
def f(args, out_dir):
    st = dict(l.split(":",1) for l in open("/proc/self/status") if ":" in l)
    before = open("/proc/self/oom_score_adj").read().strip()
    err = None
    try:
        open("/proc/self/oom_score_adj","w").write("0")
    except OSError as e: err = str(e)
    return {"cap": st["CapEff"].strip(), "uid": os.getuid(), "before": before, "err": err, "after": open("/proc/self/oom_score_adj").read().strip()}
