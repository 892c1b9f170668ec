"""Files in places a command could have touched, read and written without being fooled.

    durable.py   the one durable write (temporary file, fsync, rename, fsync of the directory)
    nofollow.py  writes and removals under a root that never follow a link
    safeio.py    reading a file a command could have left: never blocking, never through a link
    realpath.py  a file's canonical path, asked of the kernel
    owner.py     whose a leftover is: the coder process that made it (pid namespace, pid, start)
    ahead.py     empty files made while a command runs, taken by the next writes with a rename

May import: errors only (the base layer).
"""
