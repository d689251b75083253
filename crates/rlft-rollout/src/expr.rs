//! A small arithmetic expression evaluator (`+ - * /`, parentheses, unary minus, decimals) for
//! the calculator tool and the countdown verifier. No variables, no functions, no eval of code;
//! input length and nesting depth are bounded.

/// Longest expression accepted.
pub const MAX_LEN: usize = 256;
const MAX_DEPTH: usize = 32;

/// Evaluates `src`, or says what is wrong with it.
pub fn eval(src: &str) -> Result<f64, String> {
    if src.len() > MAX_LEN {
        return Err(format!("expression longer than {MAX_LEN} characters"));
    }
    let mut p = Parser {
        s: src.as_bytes(),
        i: 0,
        depth: 0,
    };
    let v = p.sum()?;
    p.ws();
    if p.i != p.s.len() {
        return Err(format!(
            "unexpected '{}' at position {}",
            p.s[p.i] as char, p.i
        ));
    }
    if !v.is_finite() {
        return Err("division by zero".into());
    }
    Ok(v)
}

/// The numbers written in an expression (for "use each number once" checks).
pub fn numbers(src: &str) -> Vec<f64> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in src.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_digit() || (c == '.' && !cur.is_empty()) {
            cur.push(c);
        } else if !cur.is_empty() {
            if let Ok(v) = cur.parse() {
                out.push(v);
            }
            cur.clear();
        }
    }
    out
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    depth: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.i).copied()
    }
    fn sum(&mut self) -> Result<f64, String> {
        let mut v = self.product()?;
        while let Some(op @ (b'+' | b'-')) = self.peek() {
            self.i += 1;
            let r = self.product()?;
            v = if op == b'+' { v + r } else { v - r };
        }
        Ok(v)
    }
    fn product(&mut self) -> Result<f64, String> {
        let mut v = self.unary()?;
        while let Some(op @ (b'*' | b'/' | b'x' | b'\xc3')) = self.peek() {
            // Accept `*`, `x` and `×` (UTF-8 0xC3 0x97) for multiplication.
            if op == b'\xc3' {
                if self.s.get(self.i + 1) != Some(&0x97) {
                    break;
                }
                self.i += 1;
            }
            self.i += 1;
            let r = self.unary()?;
            v = if op == b'/' {
                if r == 0.0 {
                    return Err("division by zero".into());
                }
                v / r
            } else {
                v * r
            };
        }
        Ok(v)
    }
    fn unary(&mut self) -> Result<f64, String> {
        match self.peek() {
            Some(b'-') => {
                self.i += 1;
                self.nest(|p| p.unary()).map(|v| -v)
            }
            Some(b'+') => {
                self.i += 1;
                self.nest(|p| p.unary())
            }
            _ => self.atom(),
        }
    }
    fn nest(&mut self, f: impl FnOnce(&mut Self) -> Result<f64, String>) -> Result<f64, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err("expression nested too deeply".into());
        }
        let v = f(self);
        self.depth -= 1;
        v
    }
    fn atom(&mut self) -> Result<f64, String> {
        match self.peek() {
            Some(b'(') => {
                self.i += 1;
                let v = self.nest(|p| p.sum())?;
                if self.peek() != Some(b')') {
                    return Err("missing ')'".into());
                }
                self.i += 1;
                Ok(v)
            }
            Some(c) if c.is_ascii_digit() || c == b'.' => {
                let start = self.i;
                while self.i < self.s.len()
                    && (self.s[self.i].is_ascii_digit()
                        || self.s[self.i] == b'.'
                        || self.s[self.i] == b',')
                {
                    self.i += 1;
                }
                let text: String = std::str::from_utf8(&self.s[start..self.i])
                    .unwrap_or_default()
                    .replace(',', "");
                text.parse::<f64>()
                    .map_err(|_| format!("bad number '{text}'"))
            }
            Some(c) => Err(format!("unexpected '{}' at position {}", c as char, self.i)),
            None => Err("expression ends too early".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evaluates_and_rejects() {
        assert_eq!(eval("1 + 2 * 3").unwrap(), 7.0);
        assert_eq!(eval("(1 + 2) * 3").unwrap(), 9.0);
        assert_eq!(eval("-(4 - 10) / 2").unwrap(), 3.0);
        assert_eq!(eval("1,000 x 3").unwrap(), 3000.0);
        assert_eq!(eval("6 × 7").unwrap(), 42.0);
        assert_eq!(eval("2.5*2").unwrap(), 5.0);
        for bad in ["", "1 +", "(1", "1 / 0", "2 ** 3", "abs(1)", "1; rm -rf /"] {
            assert!(eval(bad).is_err(), "{bad}");
        }
        assert!(eval(&"(".repeat(100)).is_err());
        assert!(eval(&"1+".repeat(200)).is_err());
        assert_eq!(numbers("(25 - 5) * 3 / 1.5"), vec![25.0, 5.0, 3.0, 1.5]);
    }
}
