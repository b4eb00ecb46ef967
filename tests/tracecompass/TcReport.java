// SPDX-License-Identifier: MIT
// TcReport - reads CTF traces with Trace Compass's own core libraries, headless, and prints
// what Trace Compass understood as one JSON object on stdout.
//
//   java -cp CLASSPATH TcReport kernel TRACE_DIR
//       opens TRACE_DIR as an LTTng kernel trace (LttngKernelTrace, the type Trace Compass
//       picks for `domain = "kernel"`), indexes it, runs KernelAnalysisModule (the analysis
//       behind the Control Flow and Resources views) and reports its state system: thread
//       names, per-CPU states, IRQs, softirqs and system calls.
//   java -cp CLASSPATH TcReport disks TRACE_DIR
//       opens TRACE_DIR as an LTTng kernel trace, runs InputOutputAnalysisModule (the analysis
//       behind the Disk I/O views) and reports, per disk, its name, the sectors read and
//       written and the requests that went through its driver queue.
//   java -cp CLASSPATH TcReport experiment TRACE_DIR...
//       opens the traces as one experiment (TmfExperiment, what "Open as experiment" builds)
//       and reports each trace's time range and the experiment's.
//   java -cp CLASSPATH TcReport events TRACE_DIR PREFIX
//       opens TRACE_DIR (as an LTTng kernel trace when it is one), reads every event as the
//       events table does (seek, then next), and reports the trace's event count and, for
//       the events whose name starts with PREFIX, each one's name, time and fields.
//
// Times are nanoseconds since the Unix epoch, as Trace Compass computes them from the CTF
// clock. Exit codes: 0 report printed, 1 the trace was refused or the analysis failed (the
// reason on stderr), 2 bad arguments.
//
// This is our own test driver (tests/tracecompass/README.md): it runs outside Eclipse, as a
// plain Java program on a classpath of Trace Compass's core jars and Debian's Eclipse
// libraries, so only the classes that need no OSGi framework may be touched here.

import java.io.File;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;

import com.google.gson.GsonBuilder;

import org.eclipse.core.runtime.IStatus;
import org.eclipse.tracecompass.analysis.os.linux.core.kernel.KernelAnalysisModule;
import org.eclipse.tracecompass.internal.analysis.os.linux.core.inputoutput.InputOutputAnalysisModule;
import org.eclipse.tracecompass.tmf.core.statesystem.TmfStateSystemAnalysisModule;
import org.eclipse.tracecompass.lttng2.kernel.core.trace.LttngKernelTrace;
import org.eclipse.tracecompass.statesystem.core.ITmfStateSystem;
import org.eclipse.tracecompass.statesystem.core.interval.ITmfStateInterval;
import org.eclipse.tracecompass.tmf.core.event.ITmfEvent;
import org.eclipse.tracecompass.tmf.core.trace.ITmfTrace;
import org.eclipse.tracecompass.tmf.core.trace.experiment.TmfExperiment;
import org.eclipse.tracecompass.tmf.ctf.core.event.CtfTmfEvent;
import org.eclipse.tracecompass.tmf.ctf.core.trace.CtfTmfTrace;

public final class TcReport {

    /** Trace Compass's CPU status values (os.linux StateValues.CPU_STATUS_*), by name. */
    private static final Map<Integer, String> CPU_STATUS = Map.of(
            0, "idle", 1, "softirq_raised", 2, "usermode", 4, "syscall", 8, "softirq",
            16, "irq");

    private TcReport() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 2 || !List.of("kernel", "disks", "experiment", "events").contains(args[0])
                || (args[0].equals("events") && args.length != 3)) {
            System.err.println("usage: TcReport kernel TRACE_DIR | disks TRACE_DIR | experiment TRACE_DIR..."
                    + " | events TRACE_DIR PREFIX");
            System.exit(2);
        }
        // Eclipse's runtime prints notices on stdout ("Product-specified preferences called
        // before plugin is started"): stdout is the report's alone, so they go to stderr.
        java.io.PrintStream stdout = System.out;
        System.setOut(System.err);
        Map<String, Object> report;
        try {
            report = args[0].equals("kernel") ? kernel(args[1])
                    : args[0].equals("disks") ? disks(args[1])
                    : args[0].equals("events") ? events(args[1], args[2])
                    : experiment(List.of(args).subList(1, args.length));
        } catch (Refused e) {
            System.err.println("TcReport: " + e.getMessage());
            System.exit(1);
            return;
        } catch (Throwable e) {
            // Trace Compass's worker threads would keep the JVM alive after main() throws.
            System.err.println("TcReport: Trace Compass failed:");
            e.printStackTrace();
            System.exit(1);
            return;
        }
        stdout.println(new GsonBuilder().serializeNulls().setPrettyPrinting().create().toJson(report));
        stdout.flush();
        // Trace Compass leaves worker threads (request executors, jobs) behind.
        System.exit(0);
    }

    /** The trace, the analysis or a query failed: the message says which and why. */
    private static final class Refused extends Exception {
        private static final long serialVersionUID = 1L;

        Refused(String what) {
            super(what);
        }
    }

    // ------------------------------------------------------------------------ opening

    /** Opens `dir` as an LTTng kernel trace, as Trace Compass's trace type detection would. */
    private static LttngKernelTrace openKernel(String dir) throws Refused {
        LttngKernelTrace trace = new LttngKernelTrace();
        IStatus valid = trace.validate(null, dir);
        if (!valid.isOK()) {
            throw new Refused(dir + " is not an LTTng kernel trace for Trace Compass: "
                    + valid.getMessage());
        }
        try {
            trace.initTrace(null, dir, CtfTmfEvent.class);
        } catch (Exception e) {
            throw new Refused("Trace Compass cannot open " + dir + ": " + e);
        }
        return trace;
    }

    /** An LTTng kernel trace when it validates as one, else a plain CTF trace. */
    private static CtfTmfTrace openAny(String dir) throws Refused {
        if (new LttngKernelTrace().validate(null, dir).isOK()) {
            return openKernel(dir);
        }
        CtfTmfTrace trace = new CtfTmfTrace();
        IStatus valid = trace.validate(null, dir);
        if (!valid.isOK()) {
            throw new Refused(dir + " is not a CTF trace for Trace Compass: " + valid.getMessage());
        }
        try {
            trace.initTrace(null, dir, CtfTmfEvent.class);
        } catch (Exception e) {
            throw new Refused("Trace Compass cannot open " + dir + ": " + e);
        }
        return trace;
    }

    private static Map<String, Object> range(ITmfTrace trace) {
        Map<String, Object> r = new TreeMap<>();
        r.put("path", trace.getPath());
        r.put("type", trace.getClass().getSimpleName());
        r.put("events", trace.getNbEvents());
        r.put("start_ns", trace.getStartTime().toNanos());
        r.put("end_ns", trace.getEndTime().toNanos());
        return r;
    }

    // ------------------------------------------------------------------------ kernel

    private static Map<String, Object> kernel(String dir) throws Refused {
        LttngKernelTrace trace = openKernel(dir);
        trace.indexTrace(true);
        Map<String, Object> out = new TreeMap<>();
        Map<String, Object> t = range(trace);
        t.put("event_layout", trace.getKernelEventLayout().getClass().getSimpleName());
        out.put("trace", t);
        ITmfStateSystem ss = runKernelAnalysis(trace);
        out.put("state_system", Map.of("start_ns", ss.getStartTime(),
                "end_ns", ss.getCurrentEndTime(), "attributes", ss.getNbAttributes()));
        out.put("threads", threads(ss));
        out.put("cpus", cpus(ss));
        out.put("syscalls", syscalls(ss));
        trace.dispose();
        return out;
    }

    private static ITmfStateSystem runKernelAnalysis(ITmfTrace trace) throws Refused {
        return runAnalysis(new KernelAnalysisModule(), trace);
    }

    /** Runs a state-system analysis on `trace` and returns its complete state system. */
    private static ITmfStateSystem runAnalysis(TmfStateSystemAnalysisModule module, ITmfTrace trace)
            throws Refused {
        String name = module.getClass().getSimpleName();
        try {
            if (!module.setTrace(trace)) {
                throw new Refused(name + " does not apply to " + trace.getPath());
            }
        } catch (Refused e) {
            throw e;
        } catch (Exception e) {
            throw new Refused(name + ".setTrace failed: " + e);
        }
        IStatus scheduled = module.schedule();
        if (!scheduled.isOK()) {
            throw new Refused(name + " did not start: " + scheduled.getMessage());
        }
        if (!module.waitForCompletion()) {
            throw new Refused(name + " failed on " + trace.getPath());
        }
        ITmfStateSystem ss = module.getStateSystem();
        if (ss == null) {
            throw new Refused(name + " built no state system");
        }
        ss.waitUntilBuilt();
        return ss;
    }

    /** Every interval of `quarks` over the whole state system. */
    private static Iterable<ITmfStateInterval> intervals(ITmfStateSystem ss, List<Integer> quarks)
            throws Refused {
        if (quarks.isEmpty()) {
            return Collections.emptyList();
        }
        try {
            return ss.query2D(quarks, ss.getStartTime(), ss.getCurrentEndTime());
        } catch (Exception e) {
            throw new Refused("state system query failed: " + e);
        }
    }

    /** Threads/<tid> (or 0_<cpu> for each CPU's idle thread): the last name each one had. */
    private static List<Map<String, Object>> threads(ITmfStateSystem ss) throws Refused {
        Map<Integer, String> nameOf = new TreeMap<>();
        Map<Integer, Long> nameAt = new TreeMap<>();
        for (ITmfStateInterval i : intervals(ss, ss.getQuarks("Threads", "*", "Exec_name"))) {
            Object v = i.getValue();
            int thread = ss.getParentAttributeQuark(i.getAttribute());
            if (v instanceof String && !((String) v).isEmpty()
                    && i.getStartTime() >= nameAt.getOrDefault(thread, Long.MIN_VALUE)) {
                nameOf.put(thread, (String) v);
                nameAt.put(thread, i.getStartTime());
            }
        }
        List<Map<String, Object>> out = new ArrayList<>();
        for (int q : ss.getQuarks("Threads", "*")) {
            Map<String, Object> th = new TreeMap<>();
            th.put("attribute", ss.getAttributeName(q));
            th.put("name", nameOf.get(q));
            out.add(th);
        }
        return out;
    }

    private static <K> void count(Map<K, Long> m, K key) {
        m.merge(key, 1L, Long::sum);
    }

    /** Per CPU: intervals per status, per IRQ and per softirq; threads that ran on it. */
    private static Map<String, Object> cpus(ITmfStateSystem ss) throws Refused {
        Map<String, Object> out = new TreeMap<>();
        for (int cpu : ss.getQuarks("CPUs", "*")) {
            Map<String, Long> states = new TreeMap<>();
            for (ITmfStateInterval i : intervals(ss, List.of(cpu))) {
                Object v = i.getValue();
                if (v instanceof Integer) {
                    count(states, CPU_STATUS.getOrDefault(v, "status_" + v));
                }
            }
            Map<String, Object> c = new TreeMap<>();
            c.put("states", states);
            c.put("irqs", busy(ss, ss.getQuarks(cpu, "IRQs", "*")));
            c.put("softirqs", busy(ss, ss.getQuarks(cpu, "Soft_IRQs", "*")));
            TreeSet<Integer> ran = new TreeSet<>();
            for (ITmfStateInterval i : intervals(ss, ss.getQuarks(cpu, "Current_thread"))) {
                if (i.getValue() instanceof Integer) {
                    ran.add((Integer) i.getValue());
                }
            }
            c.put("current_threads", ran.size());
            out.put(ss.getAttributeName(cpu), c);
        }
        return out;
    }

    /** For each attribute (an IRQ or softirq number): its intervals with a value (active). */
    private static Map<String, Long> busy(ITmfStateSystem ss, List<Integer> quarks)
            throws Refused {
        Map<String, Long> out = new TreeMap<>();
        for (ITmfStateInterval i : intervals(ss, quarks)) {
            if (i.getValue() != null) {
                count(out, ss.getAttributeName(i.getAttribute()));
            }
        }
        return out;
    }

    /** System call names seen in Threads/{tid}/System_call, with their interval counts. */
    private static Map<String, Long> syscalls(ITmfStateSystem ss) throws Refused {
        Map<String, Long> out = new TreeMap<>();
        for (ITmfStateInterval i : intervals(ss, ss.getQuarks("Threads", "*", "System_call"))) {
            if (i.getValue() instanceof String) {
                count(out, (String) i.getValue());
            }
        }
        return out;
    }

    // ------------------------------------------------------------------------ disks

    private static Map<String, Object> disks(String dir) throws Refused {
        LttngKernelTrace trace = openKernel(dir);
        trace.indexTrace(true);
        ITmfStateSystem ss = runAnalysis(new InputOutputAnalysisModule(), trace);
        Map<String, Object> out = new TreeMap<>();
        out.put("trace", range(trace));
        List<Map<String, Object>> disks = new ArrayList<>();
        for (int disk : ss.getQuarks("Disks", "*")) {
            disks.add(disk(ss, disk));
        }
        out.put("disks", disks);
        trace.dispose();
        return out;
    }

    /** One disk: its device number and name, sectors read and written at the end, and the
     * requests of its driver queue (intervals of a slot's Current_request with a value). */
    private static Map<String, Object> disk(ITmfStateSystem ss, int disk) throws Refused {
        Map<String, Object> d = new TreeMap<>();
        d.put("dev", ss.getAttributeName(disk));
        Object name = null;
        for (ITmfStateInterval i : intervals(ss, List.of(disk))) {
            if (i.getValue() != null) {
                name = i.getValue();
            }
        }
        d.put("name", name);
        for (String counter : List.of("sectors_read", "sectors_written")) {
            Object last = 0;
            for (ITmfStateInterval i : intervals(ss, ss.getQuarks(disk, counter))) {
                if (i.getValue() != null) {
                    last = i.getValue();
                }
            }
            d.put(counter, last);
        }
        long requests = 0;
        for (ITmfStateInterval i : intervals(ss, ss.getQuarks(disk, "Driver_queue", "*",
                "Current_request"))) {
            if (i.getValue() != null) {
                requests++;
            }
        }
        d.put("driver_requests", requests);
        return d;
    }

    // ------------------------------------------------------------------------ experiment

    /**
     * Trace Compass 6.2 treats traces whose clocks share a UUID (its "host id") as one host
     * and aligns their clock offsets to the group's average; it logs a warning about that
     * average through the OSGi log, which a headless run does not have (a
     * NullPointerException). Such traces (a guest's kernel and user traces) have one clock,
     * so that alignment moves nothing; this report takes one trace per clock.
     */
    private static void refuseSharedClocks(List<ITmfTrace> traces) throws Refused {
        Map<String, String> byHost = new TreeMap<>();
        for (ITmfTrace t : traces) {
            String other = byHost.put(t.getHostId(), t.getPath());
            if (other != null) {
                throw new Refused(other + " and " + t.getPath() + " share one clock (host id "
                        + t.getHostId() + "): give the experiment one trace per clock");
            }
        }
    }

    /** Every event of `dir` read in order; those named `prefix`... listed with their fields. */
    private static Map<String, Object> events(String dir, String prefix) throws Refused {
        CtfTmfTrace trace = openAny(dir);
        long all = 0;
        List<Map<String, Object>> matched = new ArrayList<>();
        org.eclipse.tracecompass.tmf.core.trace.ITmfContext ctx = trace.seekEvent(0L);
        ITmfEvent ev;
        while ((ev = trace.getNext(ctx)) != null) {
            all++;
            String name = ev.getName();
            if (!name.startsWith(prefix)) {
                continue;
            }
            Map<String, Object> e = new TreeMap<>();
            e.put("name", name);
            e.put("ns", ev.getTimestamp().toNanos());
            Map<String, Object> fields = new TreeMap<>();
            for (org.eclipse.tracecompass.tmf.core.event.ITmfEventField f : ev.getContent().getFields()) {
                Object v = f.getValue();
                fields.put(f.getName(), v instanceof Number || v instanceof String ? v : String.valueOf(v));
            }
            e.put("fields", fields);
            matched.add(e);
        }
        ctx.dispose();
        Map<String, Object> out = range(trace);
        out.put("read", all);
        out.put("matched", matched);
        trace.dispose();
        return out;
    }

    private static Map<String, Object> experiment(List<String> dirs) throws Refused {
        List<ITmfTrace> traces = new ArrayList<>();
        for (String d : dirs) {
            if (!new File(d, "metadata").isFile()) {
                throw new Refused(d + " has no CTF metadata file");
            }
            traces.add(openAny(d));
        }
        refuseSharedClocks(traces);
        TmfExperiment exp = new TmfExperiment(ITmfEvent.class, "ivtrace-experiment",
                traces.toArray(new ITmfTrace[0]), TmfExperiment.DEFAULT_INDEX_PAGE_SIZE, null);
        exp.indexTrace(true);
        Map<String, Object> out = new TreeMap<>();
        out.put("experiment", range(exp));
        List<Map<String, Object>> each = new ArrayList<>();
        for (ITmfTrace t : exp.getTraces()) {
            each.add(range(t));
        }
        out.put("traces", each);
        exp.dispose();
        return out;
    }
}
