"""What each policy key means, in the user's words: one entry per key of the JSON Schema
(governor schema), with one example line in TOML as it is written in its section. The type,
the default and the allowed values come from the schema, never from here; a test checks that
this table and the schema name the same keys and that every example validates
(tests/unit/manual/test_policyref.py)."""

from __future__ import annotations

from governor.monitor.actions import registry as verbs

# section ("" = the top level) -> what the section is for
SECTIONS: dict[str, str] = {
    "": "A policy is one TOML file per engine. Its top-level keys name it and place its slice;"
    " the tables below set the cgroup v2 limits, the process, the engine and the rules. Every"
    " key is optional except `name` (and `when`/`do` in a `[[pressure]]` rule); a key that is"
    " absent writes nothing, so the kernel's default stays.",
    "memory": "The memory controller's files of the engine's group: protection (min, low) and"
    " limits (high, max, swap.max). A size is an integer number of bytes or a string: `1.5GiB`,"
    " `800M` (binary units: K, M, G, T, with or without `iB`), a share of the board's MemTotal"
    " (`70%`) or `max` (no limit). `min <= low <= high <= max` is checked, again after the"
    " percentages are resolved on the host.",
    "cpu": "Which CPUs the engine runs on (cpuset) and its share of them (cpu.weight, cpu.max).",
    "io": "The io controller's proportional weight of the engine's group.",
    "pids": "A cap on the number of tasks (processes and threads) in the engine's group.",
    "process": "How the engine's process is started: its account, OOM score, nice value,"
    " locked-memory limit and environment, and what happens to it when the governor exits"
    " or a `restart` action relaunches it.",
    "engine": "What the governor knows about the engine it launches: its kind (llama.cpp's"
    " options are checked against the budget), the context and cache caps `check` and"
    " `launch` accept, and when a server counts as ready.",
    "prefetch": "Read the model into the page cache from inside the engine's group while the"
    " engine starts, so the pages are charged to (and protected by) its slice.",
    "device": "Memory the engine needs outside memcg's reach (NPU/GPU buffers): checked at"
    " preflight against what the board can give (MemAvailable, or CmaFree with"
    ' `pool = "cma"`) minus the other governed groups\' memory.min.',
    "clocks": "The board's clocks while the slice lives: the cpufreq policies of the CPU"
    " clusters (`big`, `little`) and the devfreq devices (`npu`, `gpu`, `dmc`). Each is a"
    ' governor name (`dmc = "performance"`) or a table of `governor`, `min`, `max` and `freq`'
    " (the userspace governor's fixed frequency). A frequency is `max`, `min`, an integer in"
    " the unit of the board's own list (cpufreq kHz, devfreq Hz) or a value with its unit"
    " (`1.8GHz`, `2112MHz`); it must be in the board's available list. The previous settings"
    " are restored when the slice goes.",
    "pressure": "Rules the monitor acts on for the engine's lifetime (`launch`, or `monitor` for"
    " a running slice), one `[[pressure]]` table per rule. Each firing runs all of its `do`"
    " actions in order; rules written from mild to severe escalate in that order.",
    "qos": "The policy's class among the board's workloads, and what the `shed` action of a"
    " higher class may do to this slice.",
}

# "section.key" (top level: "key") -> (what it does, with its unit; one example TOML line)
KEYS: dict[str, tuple[str, str]] = {
    "name": (
        "The policy's name: its group is `<slice>/<name>`, `status`, `tune` and `rollback` take"
        " it, and systemd units are named after it. Lower-case letters, digits, `_` and `-`,"
        " starting with a letter or digit, at most 63 characters.",
        'name = "npu-chat"',
    ),
    "description": (
        "Free text about the policy (`governor init` writes what it sized); inherited"
        " through `extends` unless given.",
        'description = "chat on a 2 GB board"',
    ),
    "extends": (
        "A policy file this one builds on, relative to this file: tables merge key by key,"
        " scalars and arrays replace.",
        'extends = "base.toml"',
    ),
    "slice": (
        "The parent slice: the engine runs in `<slice>/<name>/engine`. A systemd slice name"
        " (ending in `.slice`; `-` separates parent slices).",
        'slice = "governor.slice"',
    ),
    "memory.min": (
        "Protected memory (memory.min): the kernel does not reclaim the group below it, e.g."
        " the model's page cache. A size, a share of MemTotal, `max`, or `model` (the model"
        " file's size plus a margin).",
        'min = "1.1GiB"',
    ),
    "memory.low": (
        "Best-effort protection (memory.low): reclaimed below it only when nothing else can"
        " be. Same values as min.",
        'low = "model"',
    ),
    "memory.high": (
        "The throttle point (memory.high): above it the group is slowed and reclaimed, not"
        " killed. A size, a share of MemTotal or `max`.",
        'high = "1.6GiB"',
    ),
    "memory.max": (
        "The hard limit (memory.max): above it the kernel's OOM killer acts inside the group"
        " only. A size, a share of MemTotal or `max`. `check` and `launch` refuse a model"
        " (plus KV cache, when known) that does not fit it.",
        'max = "1.8GiB"',
    ),
    "memory.swap_max": (
        "The swap limit (memory.swap.max); `0` keeps the engine out of swap.",
        'swap_max = "0"',
    ),
    "memory.zswap_max": (
        "The group's zswap pool limit (memory.zswap.max, kernel 5.19+): compressed pages the"
        " group may keep in zswap, charged to it; `0` sends its swap straight to the device.",
        'zswap_max = "256M"',
    ),
    "memory.zswap_writeback": (
        "memory.zswap.writeback (kernel 6.8+): `false` keeps the group's zswap pages off the"
        " swap device (an SD card's writes); refused on older kernels unless"
        " `--allow-missing zswap`.",
        "zswap_writeback = false",
    ),
    "memory.oom_group": (
        "memory.oom.group: an OOM kill takes the engine's whole process tree together.",
        "oom_group = true",
    ),
    "cpu.cpus": (
        "The CPUs (cpuset.cpus): a list like `4-7` or `0-3,6`, `big` or `little` (the"
        " clusters found from cpu_capacity) or `all`.",
        'cpus = "big"',
    ),
    "cpu.weight": (
        "cpu.weight, 1 to 10000 (the kernel's default is 100): the group's share of CPU"
        " time under contention.",
        "weight = 200",
    ),
    "cpu.max": (
        "cpu.max as a share of one CPU (`350%` = three and a half CPUs' time per period) or `max`.",
        'max = "350%"',
    ),
    "io.weight": ("io.weight, 1 to 10000 (the kernel's default is 100).", "weight = 100"),
    "pids.max": (
        "pids.max: the most tasks (processes and threads) the group may hold, or `max`.",
        "max = 512",
    ),
    "process.user": (
        "Run the engine as this user (initgroups, setgid, setuid before exec).",
        'user = "llm"',
    ),
    "process.group": (
        "Run the engine with this primary group (default: the user's).",
        'group = "llm"',
    ),
    "process.oom_score_adj": (
        "The engine's /proc/PID/oom_score_adj, -1000 to 1000: how readily the kernel's"
        " global OOM killer picks it.",
        "oom_score_adj = 500",
    ),
    "process.nice": ("The engine's nice value, -20 to 19.", "nice = 0"),
    "process.memlock": (
        "RLIMIT_MEMLOCK of the engine: bytes, a size, `model` (the model file's size plus"
        " 64 MiB, for llama.cpp's --mlock) or `unlimited`.",
        'memlock = "model"',
    ),
    "process.env": (
        "Environment variables set for the engine (names as the shell takes them).",
        'env = { OMP_WAIT_POLICY = "PASSIVE" }',
    ),
    "process.on_governor_exit": (
        "What happens to the engine when the governor's supervisor is killed: `kill` (the"
        " group is killed) or `keep` (it runs on, still in its limits).",
        'on_governor_exit = "kill"',
    ),
    "process.restart_max": (
        "How many times a `restart` action may relaunch the engine per launch (0: never).",
        "restart_max = 3",
    ),
    "process.restart_backoff": (
        "The wait before a relaunch, a duration; doubles each time, at most 60 s.",
        'restart_backoff = "1s"',
    ),
    "engine.kind": (
        "`llama.cpp` (its argv is read: model, context, cache, threads), `rkllm` (RKLLM's"
        " llm_demo MODEL.rkllm MAX_NEW_TOKENS MAX_CONTEXT_LEN, its model in NPU memory) or"
        " `generic` (nothing is read from the argv).",
        'kind = "llama.cpp"',
    ),
    "engine.max_context_tokens": (
        "The largest context (tokens, llama.cpp's -c) `check` and `launch` accept.",
        "max_context_tokens = 2048",
    ),
    "engine.max_cache_ram": (
        "llama-server's prompt cache cap in MiB, as --cache-ram takes it: `check` and"
        " `launch` refuse a larger one (or none, or -1). Absent: no cap.",
        "max_cache_ram = 1284",
    ),
    "engine.threads": (
        "The engine's thread count as the policy's author meant it (llama.cpp's -t); recorded"
        " in the plan (`governor plan` shows it), not enforced.",
        "threads = 4",
    ),
    "engine.evict": (
        "llama-server's router (`--models-dir`/`--models-preset`) loads up to `--models-max`"
        " models whatever they weigh. `count`: `check` and `launch` refuse a `--models-max`"
        " under which its largest models cannot fit memory.max together (65, naming the count"
        " that fits). `memory`: accepted with a warning; the governor is to make room by"
        " memory (issue 38).",
        'evict = "memory"',
    ),
    "engine.models": (
        "One table a router model, by its name (the child's `--alias`: the GGUF's stem in"
        " `--models-dir`, the section in the preset): `max`, `high` (sizes) and `oom_group`"
        " for the model's own leaf `<slice>/<name>/models/<leaf>`. The leaf is the name mapped"
        " to a safe directory name: `/` and `%` escaped (`org/tiny:Q8_0` is"
        " `org%2Ftiny:Q8_0`), a name like a kernel file prefixed (`memory.max` is"
        " `_memory.max`), cut to 255 bytes with a hash; `status` shows it. A name with a"
        " control character, `.` or `..` is refused (65).",
        'models = { small = { max = "300M", oom_group = true } }',
    ),
    "engine.ready": (
        "The engine is ready (READY=1 to systemd) when this http:// URL answers 200;"
        " `exec`: ready once exec'd. llama-server's is derived from --host/--port when"
        " absent.",
        'ready = "http://127.0.0.1:8080/health"',
    ),
    "engine.ready_timeout": (
        "A duration: not ready by then, the engine is stopped (SIGTERM, SIGKILL 10 s later)"
        " and the governor exits 69.",
        'ready_timeout = "300s"',
    ),
    "engine.probe_generate": (
        "A duration: once the server is ready, ask it for one token (POST /v1/completions,"
        " max_tokens 1) every interval, the interval being each request's deadline; 3 failed"
        " in a row (its /health may stay green while a load path or a slot is stuck; one while"
        " a slot decodes, per GET /slots, does not count) and the"
        " engine is journaled as unresponsive and stopped, relaunched while"
        " `process.restart_max` allows, else the governor exits 69. At least 1s; needs a server"
        " (engine.ready as its URL, or llama-server's --host/--port; not `exec`, not rkllm);"
        " not used for a router (a completion there loads a model). Off when absent: each probe is a generation, and with one slot"
        " it replaces that slot's cached prompt.",
        'probe_generate = "30s"',
    ),
    "prefetch.files": (
        "`auto` (the engine's -m model) or a list of paths and globs.",
        'files = ["/models/q4.gguf"]',
    ),
    "prefetch.mode": (
        "`none`, `advise` (WILLNEED hints), `populate` (read the pages in; warm pages are"
        " found with mincore() and skipped) or `lock` (populate, then hold an mlock of the"
        " files until the engine exits).",
        'mode = "populate"',
    ),
    "device.memory": (
        "The device memory the engine needs: a size or `model` (the model file's size;"
        " rkllm's default is the .rkllm file's).",
        'memory = "1.2GiB"',
    ),
    "device.pool": (
        "Where device memory comes from: `system` (checked against MemAvailable) or `cma`"
        " (against CmaFree).",
        'pool = "system"',
    ),
    "clocks.big": (
        "The cpufreq policy of the big cluster: a governor name or a table.",
        'big = { governor = "performance", min = "max" }',
    ),
    "clocks.little": (
        "The cpufreq policy of the LITTLE cluster: a governor name or a table.",
        'little = "powersave"',
    ),
    "clocks.npu": (
        "The NPU's devfreq device: a governor name or a table.",
        'npu = { governor = "userspace", freq = "1GHz" }',
    ),
    "clocks.gpu": ("The GPU's devfreq device: a governor name or a table.", 'gpu = "performance"'),
    "clocks.dmc": (
        "The memory controller's devfreq device (DRAM clock): a governor name or a table.",
        'dmc = "performance"',
    ),
    "pressure.when": (
        "The condition: a PSI trigger on the slice (`memory some 150ms/2s`: resource, some or"
        " full, stall/window with a window of 500ms to 10s) or on the whole board"
        " (`board memory some 100ms/1s`, `system ...`), `leak > 500KB/s for 60s` (sustained"
        " growth of anon memory), `memavailable < 800M` or `board available < 200M` (board"
        " floors), `board available < headroom` (the board can give less than the slice's"
        " claimed peak still needs: shed before the board is full), `refaults > 50%/10s` or"
        " `board refaults > 30%/10s` (the file cache read again in the window: thrash that PSI"
        " misses), `device memory > 1.5G` (the group's DRM and dma-buf memory) or a"
        " memory.events counter (`oom_kill`, `oom_group_kill`, `oom`, `max`, `high`).",
        'when = "memory some 150ms/2s"',
    ),
    "pressure.for": (
        "A duration the condition must hold before the rule fires.",
        'for = "4s"',
    ),
    "pressure.do": (
        f"The actions, run in order at each firing: {verbs.usage()}.",
        'do = ["log", "reclaim 64M"]',
    ),
    "pressure.cooldown": (
        "A duration: the rule does not fire again until it has passed; for `shed`, the quiet"
        " time after which the shed is undone.",
        'cooldown = "5s"',
    ),
    "qos.class": (
        "`interactive`, `standard` or `background`: a `shed` takes memory only from slices of"
        " a strictly lower class.",
        'class = "interactive"',
    ),
    "qos.yield": (
        "What a higher class's `shed` may do to this slice, a subset of `unload`, `throttle`,"
        " `freeze`, `stop`, `kill` in that order; `unload` (a llama-server router's least"
        " recently used idle model, again while one is idle) is passed over by a slice that is"
        ' no router; without "kill" it is never killed by a shed.',
        'yield = ["throttle", "freeze"]',
    ),
    "qos.admit": (
        "What `launch` and `install` do when this slice's expected peak does not fit beside the"
        " board's other claims (docs/several.md): `warn` admits it with one warning line,"
        " `refuse` exits 75, `wait` waits up to `admit_timeout` for room, `shed` stops running"
        " engines of a lower class. Guarantees (memory.min) never overcommit: `warn` and"
        " `refuse` refuse then, `wait` and `shed` act.",
        'admit = "shed"',
    ),
    "qos.admit_timeout": (
        'How long `admit = "wait"` (or a shed\'s victims) may take to make room before the'
        " launch exits 75.",
        'admit_timeout = "2m"',
    ),
}
