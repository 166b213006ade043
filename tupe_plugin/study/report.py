def write_report(config, jobs, outcome, out):
    return {"md": "", "json": "", "figures": ""}
