"""One section of bench/RESULTS.md, written in place by the bench scripts that own one
(context_parallel.py, tensor_parallel.py, pipeline_parallel.py).

write_section(title, text, path): `text` (starting with the `## N. ...` heading `title`) replaces
the section with that heading, up to the next `## ` heading; a new section goes before
`## Commands` (else at the end). One blank line separates it from the next section.
"""


def write_section(title, text, path):
    text = text.rstrip("\n") + "\n"
    body = open(path).read()
    start = body.find(title)
    if start >= 0:
        nxt = body.find("\n## ", start + len(title))
        body = body[:start] + text + ("\n" + body[nxt + 1:] if nxt >= 0 else "")
    elif "\n## Commands" in body:
        at = body.index("\n## Commands") + 1
        body = body[:at] + text + "\n" + body[at:]
    else:
        body = body.rstrip("\n") + "\n\n" + text
    with open(path, "w") as f:
        f.write(body)
