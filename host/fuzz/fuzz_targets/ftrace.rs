//! A guest's ftrace path: its published text (`events/header_page` and
//! event format files, which the guest writes) and its pages. The input is
//! split at the first two NUL bytes: header_page text, event format text,
//! then page bytes. Formats must parse or be refused, never panic; every
//! record of every page decodes or is refused; the CTF classes built from
//! a format are valid.
#![no_main]

use ivtrace_tracefs::decode::Decoder;
use ivtrace_tracefs::format::{parse_event, parse_header_page};
use ivtrace_tracefs::page;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |&b| b == 0);
    let header_text = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let format_text = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let pages = parts.next().unwrap_or_default();
    let hp = parse_header_page(&header_text).unwrap_or_default();
    let formats: Vec<_> = parse_event("fuzz", &format_text)
        .ok()
        .map(|f| vec![(f, 1u32)])
        .unwrap_or_default();
    let (decoder, _classes) = Decoder::new(&formats);
    for p in pages.chunks(4096) {
        let _ = page::missed_before(p, &hp);
        let _ = page::walk(p, &hp, |_ts, rec| {
            let _ = decoder.decode(rec);
        });
    }
});
