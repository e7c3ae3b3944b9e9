#!/usr/bin/env python3
"""prebuilt_pick.py DIR NAME ROOT BUILD OBJ...: which of a patch's rebuilt objects launch/prebuilt.sh pack
keeps. nvcc writes a per-compile module id into every object, so bytes cannot tell a recompile from a
change; the sources can. An object's sources are its depfile's (OBJ.d); the patch set's files had the
contents DIR/.hashes_main (main), DIR/.hashes_<tree> (each patch as applied). An object whose sources
read as main's is a recompile (dropped); as an earlier tree's that keeps or inherits it, inherited
(a line 'OBJ TREE' in DIR/NAME/inherit, TREE the one holding the file); else kept (printed). A file
DIR/.keep_NAME naming sources (the patch header's "Pack-keep-only:" list, launch/prebuilt.sh) limits both
to the objects built from a file of that list (by their depfiles): the rest take main's (a header change the author
says cannot alter them)."""
import os
import sys


def hashes(path):
    out = {}
    for line in open(path):
        f, h = line.split()
        out[f] = h
    return out


def sources(root, build, obj):
    """the depfile's files under root, relative to it"""
    text = open(os.path.join(root, build, obj + ".d")).read().replace("\\\n", " ")
    deps = text.split(":", 1)[1].split()
    return {os.path.relpath(d, root) for d in deps if d.startswith(root + "/")}


def main():
    out_dir, name, root, build = sys.argv[1:5]
    objs = sys.argv[5:]
    root = os.path.realpath(root)
    mine = hashes(os.path.join(out_dir, ".hashes_" + name))
    ref = hashes(os.path.join(out_dir, ".hashes_main"))
    order = [l.strip() for l in open(os.path.join(out_dir, ".trees"))] if os.path.exists(os.path.join(out_dir, ".trees")) else []
    keep_path = os.path.join(out_dir, ".keep_" + name)
    keep_only = set(open(keep_path).read().split()) if os.path.exists(keep_path) else set()
    inherit = []
    for obj in objs:
        srcs = sources(root, build, obj)
        if keep_only and not {os.path.basename(f) for f in srcs} & keep_only:
            continue  # main's object, by the author's list (none of its sources named)
        watched = srcs & set(mine)
        state = {f: mine[f] for f in watched}
        if state == {f: ref[f] for f in watched}:
            continue  # main's sources: a recompile
        holder = None
        for tree in order:
            theirs = hashes(os.path.join(out_dir, ".hashes_" + tree))
            if state != {f: theirs[f] for f in watched}:
                continue
            if os.path.exists(os.path.join(out_dir, tree, obj)):
                holder = tree
            else:  # it inherited the object itself
                for line in open(os.path.join(out_dir, tree, "inherit")) if os.path.exists(
                        os.path.join(out_dir, tree, "inherit")) else []:
                    o, t = line.split()
                    if o == obj:
                        holder = t
            if holder:
                break
        if holder:
            inherit.append(f"{obj} {holder}\n")
        else:
            print(obj)
    if inherit:
        with open(os.path.join(out_dir, name, "inherit"), "a") as f:
            f.writelines(inherit)


if __name__ == "__main__":
    main()
