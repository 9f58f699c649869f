//! Incremental detokenization and stop strings.
//!
//! Decoding a growing token list from scratch each step is quadratic; decoding only the newest
//! token breaks multi-byte characters and byte-level merges. As vLLM does, the decoder keeps two
//! offsets: the text of `ids[prefix..read]` is known, `ids[prefix..]` is decoded, and the
//! difference is new text once it no longer ends in an incomplete character (U+FFFD).
//! Stop strings are searched in the new text plus the tail of the old; text that could still be
//! the start of a stop string is held back from streaming until it is decided.

use crate::model::Tokenizer;

/// Text of one generated sequence, built token by token.
#[derive(Debug, Default)]
pub struct TextState {
    prefix: usize,
    read: usize,
    /// The visible text so far (stop string removed once found).
    pub text: String,
    /// How much of `text` has been handed out (streaming).
    pub emitted: usize,
    /// Set when a stop string ended the text.
    pub stopped: bool,
    /// The stop string that ended it.
    pub stopped_by: Option<String>,
}

impl TextState {
    /// Takes the generated ids so far (the newest last) and updates the text; returns whether a
    /// stop string was found.
    pub fn push(
        &mut self,
        tok: &Tokenizer,
        ids: &[u32],
        skip_special: bool,
        stop: &[String],
    ) -> bool {
        if self.stopped {
            return true;
        }
        let decode = |s: &[u32]| tok.decode(s, skip_special).unwrap_or_default();
        let known = decode(&ids[self.prefix..self.read]);
        let all = decode(&ids[self.prefix..]);
        if all.len() <= known.len()
            || all.ends_with('\u{FFFD}')
            || !all.is_char_boundary(known.len())
        {
            // No complete character yet.
            return false;
        }
        let start = self.text.len();
        self.text.push_str(&all[known.len()..]);
        self.prefix = self.read;
        self.read = ids.len();
        self.check_stop(stop, start)
    }

    fn check_stop(&mut self, stop: &[String], new_from: usize) -> bool {
        let longest = stop.iter().map(String::len).max().unwrap_or(0);
        if longest == 0 {
            return false;
        }
        let mut from = new_from.saturating_sub(longest - 1);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let found = stop
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| (from + i, s)))
            .min_by_key(|(at, _)| *at);
        if let Some((at, s)) = found {
            self.stopped_by = Some(s.clone());
            self.text.truncate(at);
            self.emitted = self.emitted.min(at);
            self.stopped = true;
        }
        self.stopped
    }

    /// The text not handed out yet that can be shown now: all of it once `finished`, otherwise
    /// everything except a tail that could begin a stop string.
    pub fn take_ready(&mut self, stop: &[String], finished: bool) -> String {
        let mut end = self.text.len();
        if !finished {
            for s in stop {
                for k in (1..s.len()).rev() {
                    if s.is_char_boundary(k) && self.text.ends_with(&s[..k]) {
                        end = end.min(self.text.len() - k);
                        break;
                    }
                }
            }
        }
        if end <= self.emitted {
            return String::new();
        }
        let out = self.text[self.emitted..end].to_string();
        self.emitted = end;
        out
    }
}
