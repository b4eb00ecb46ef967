//! A live copy of a recording's guest traces: the sink beside the trace
//! directory that hands each packet, final, and each trace's metadata to
//! a [`TraceSink`] (a relay session) as they come.
//!
//! The directory stages kernel packets and expands them at the end; a
//! live reader cannot wait for that, so this sink expands them as they
//! arrive (the online kernel expansion: times converted with the mapping
//! in force, clamped so each stream stays monotonic) and declares the
//! expanded classes as system calls appear. User packets go as they are. The ftrace relay's
//! pages are decoded at the end only, so the live copy has none of them.
//!
//! Each trace is described on its first packet and again whenever the
//! event classes change and at the end (the final clock mapping and env):
//! the sink keeps its copy append-only.

use ivtrace_region::abi;
use ivtrace_region::bytes::le_u32;
use ivtrace_region::classes::{EventClasses, StreamClasses};
use ivtrace_region::names::NameTable;
use ivtrace_region::reader::PacketSink;

use crate::kernel::KernelExpansion;
use crate::kernel_out::Online;
use crate::sink::TraceSink;
use crate::trace::{channel_file_name, stream_dir, CtfError, CtfWriter, TraceIds};
use crate::tsdl::{self, Timebase, TraceEnv};
use ivtrace_time::ClockMapping;

/// The live kernel trace: its expansion and the generation of the classes
/// its metadata was last sent for (None: not sent yet).
struct LiveKernel {
    online: Online,
    generation: Option<u64>,
}

/// Sends a recording's guest traces to a sink as the packets come (see
/// the module documentation).
pub struct LiveOut {
    sink: Box<dyn TraceSink>,
    ids: TraceIds,
    clock: ClockMapping,
    env: TraceEnv,
    nr_channels: u32,
    /// What the user trace's times count (the directory's choice).
    user_timebase: Timebase,
    /// The guest's thread name table as last read (for a kernel trace
    /// made after it; empty until one was read).
    name_table: NameTable,
    /// The generation the user trace's metadata was last sent for, once
    /// it had a packet.
    user: Option<u64>,
    /// The kernel trace, once it had a packet.
    kernel: Option<LiveKernel>,
}

impl LiveOut {
    /// A live copy of the traces `dir` writes (the same UUIDs, clock, env
    /// and channels), sent to `sink`.
    pub fn beside(dir: &CtfWriter, sink: Box<dyn TraceSink>) -> LiveOut {
        LiveOut {
            sink,
            ids: dir.ids().clone(),
            clock: dir.clock().clone(),
            env: dir.env().clone(),
            nr_channels: dir.nr_channels(),
            user_timebase: dir.timebase(abi::IVT_STREAM_USER),
            name_table: NameTable::default(),
            user: None,
            kernel: None,
        }
    }

    /// Names the threads no naming event sent so far names.
    pub fn set_thread_name_table(&mut self, table: NameTable) {
        if let Some(k) = &mut self.kernel {
            k.online.set_table(&table);
        }
        self.name_table = table;
    }

    /// The clock mapping in force (kernel packets from now on are
    /// converted with it; the user trace's metadata states it).
    pub fn set_clock(&mut self, clock: ClockMapping) {
        self.clock = clock;
    }

    /// What the online kernel expansion did so far.
    pub fn kernel_expansion(&self) -> Option<&KernelExpansion> {
        self.kernel.as_ref().map(|k| k.online.stats())
    }

    /// The event classes the live kernel trace declares so far.
    pub fn kernel_classes(&self) -> Option<&StreamClasses> {
        self.kernel.as_ref().map(|k| k.online.classes())
    }

    /// Sends the metadata of every trace that had a packet again, stating
    /// the final `clock` and `env`.
    pub fn finish(
        &mut self,
        clock: &ClockMapping,
        env: TraceEnv,
        classes: &EventClasses,
    ) -> Result<(), CtfError> {
        self.clock = clock.clone();
        self.env = env;
        if self.kernel.is_some() {
            self.send_kernel_metadata()?;
        }
        if self.user.is_some() {
            self.send_user_metadata(classes)?;
        }
        Ok(())
    }

    /// The kernel trace's metadata: the expanded classes so far, the
    /// clock block of the mapping its packets were converted with.
    fn send_kernel_metadata(&mut self) -> Result<(), CtfError> {
        let k = self.kernel.as_mut().expect("made");
        let clock = k.online.converted_with().unwrap_or(&self.clock);
        let desc = self.ids.desc(
            abi::IVT_STREAM_KERNEL,
            clock,
            Timebase::Nanoseconds,
            &self.env,
        );
        let classes = k.online.classes();
        let text = tsdl::metadata(&desc, abi::IVT_STREAM_KERNEL, classes);
        let trace = stream_dir(abi::IVT_STREAM_KERNEL);
        self.sink.metadata(trace, &text, Some(classes))?;
        k.generation = Some(k.online.generation());
        Ok(())
    }

    /// The user trace's metadata: its wire classes, in the directory's
    /// timebase (nanoseconds unless the drain keeps ticks).
    fn send_user_metadata(&mut self, classes: &EventClasses) -> Result<(), CtfError> {
        let stream = abi::IVT_STREAM_USER;
        let desc = self
            .ids
            .desc(stream, &self.clock, self.user_timebase, &self.env);
        let output = classes.stream(stream);
        let text = tsdl::metadata(&desc, stream, output);
        self.sink
            .metadata(stream_dir(stream), &text, Some(output))?;
        self.user = Some(classes.generation());
        Ok(())
    }

    /// A kernel packet, expanded (its new classes, if any, are declared
    /// by [`LiveOut::send_new_kernel_metadata`] before it is sent).
    fn kernel_packet(&mut self, chan: u32, bytes: &[u8], classes: &EventClasses) -> Vec<u8> {
        let table = &self.name_table;
        let k = self.kernel.get_or_insert_with(|| LiveKernel {
            online: Online::new(table),
            generation: None,
        });
        k.online.packet(chan, bytes, classes, &self.clock)
    }

    /// The kernel trace's metadata again if its classes changed since it
    /// was last sent (a packet just expanded used a new one).
    fn send_new_kernel_metadata(&mut self) -> Result<(), CtfError> {
        match &self.kernel {
            Some(k) if k.generation != Some(k.online.generation()) => self.send_kernel_metadata(),
            _ => Ok(()),
        }
    }

    /// Hands a final packet of channel `chan` to the sink.
    fn send(&mut self, chan: u32, stream: u32, bytes: &[u8]) -> Result<(), CtfError> {
        let name = channel_file_name(stream, chan, self.nr_channels);
        let events = le_u32(bytes, abi::pkt::EVENT_COUNT) as u64;
        self.sink.packet(stream_dir(stream), &name, bytes, events)
    }
}

impl PacketSink for LiveOut {
    type Error = CtfError;

    fn packet(
        &mut self,
        chan: u32,
        stream: u32,
        bytes: &[u8],
        classes: &EventClasses,
    ) -> Result<(), CtfError> {
        match stream {
            abi::IVT_STREAM_KERNEL => {
                let out = self.kernel_packet(chan, bytes, classes);
                self.send_new_kernel_metadata()?;
                self.send(chan, stream, &out)
            }
            // Decoded at the end only (see the module documentation).
            abi::IVT_STREAM_FTRACE => Ok(()),
            _ => {
                if self.user != Some(classes.generation()) {
                    self.send_user_metadata(classes)?;
                }
                self.send(chan, stream, bytes)
            }
        }
    }
}
