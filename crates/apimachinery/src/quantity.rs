//! resource.Quantity: exact fixed-point quantities (to the nano unit), parsed and printed
//! in the canonical form upstream uses (`1.5` is `1500m`, `1024Ki` is `1Mi`), with the
//! arithmetic quota and limit checks need. One implementation for the API server and the
//! components.

use std::cmp::Ordering;
use std::fmt;

use serde_json::Value;

/// How a Quantity prints (resource.Format).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    DecimalSI,
    BinarySI,
    DecimalExponent,
}

/// A resource.Quantity, exact to the nano unit (upstream rounds finer values up to nanos).
#[derive(Clone, Copy, Debug)]
pub struct Quantity {
    nanos: i128,
    pub format: Format,
}

const NANO: i128 = 1_000_000_000;

fn pow10(e: u32) -> Option<i128> {
    10i128.checked_pow(e)
}

/// `n / d` rounded away from zero (inf.RoundUp).
fn div_away(n: i128, d: i128) -> i128 {
    let q = n / d;
    if n % d != 0 {
        if n < 0 {
            q - 1
        } else {
            q + 1
        }
    } else {
        q
    }
}

impl PartialEq for Quantity {
    fn eq(&self, o: &Quantity) -> bool {
        self.nanos == o.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, o: &Quantity) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Quantity {
    fn cmp(&self, o: &Quantity) -> Ordering {
        self.nanos.cmp(&o.nanos)
    }
}

impl Quantity {
    /// A whole number, DecimalSI (resource.NewQuantity(n, DecimalSI)).
    pub fn int(n: i64) -> Quantity {
        Quantity {
            nanos: i128::from(n) * NANO,
            format: Format::DecimalSI,
        }
    }

    /// Zero, DecimalSI.
    pub fn zero() -> Quantity {
        Quantity::int(0)
    }

    /// Parses a quantity string (resource.ParseQuantity); `None` when it is not one.
    pub fn parse(s: &str) -> Option<Quantity> {
        let s = s.trim();
        if s.is_empty() {
            return None;
        }
        let b = s.as_bytes();
        let mut i = 0;
        let mut negative = false;
        if b[0] == b'+' || b[0] == b'-' {
            negative = b[0] == b'-';
            i = 1;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let num = &s[start..i];
        let mut denom = "";
        if i < b.len() && b[i] == b'.' {
            i += 1;
            let ds = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            denom = &s[ds..i];
        }
        if num.is_empty() && denom.is_empty() {
            return None;
        }
        let suffix = &s[i..];
        let (base2, exponent, format): (bool, i32, Format) = match suffix {
            "" => (false, 0, Format::DecimalSI),
            "n" => (false, -9, Format::DecimalSI),
            "u" => (false, -6, Format::DecimalSI),
            "m" => (false, -3, Format::DecimalSI),
            "k" => (false, 3, Format::DecimalSI),
            "M" => (false, 6, Format::DecimalSI),
            "G" => (false, 9, Format::DecimalSI),
            "T" => (false, 12, Format::DecimalSI),
            "P" => (false, 15, Format::DecimalSI),
            "E" => (false, 18, Format::DecimalSI),
            "Ki" => (true, 10, Format::BinarySI),
            "Mi" => (true, 20, Format::BinarySI),
            "Gi" => (true, 30, Format::BinarySI),
            "Ti" => (true, 40, Format::BinarySI),
            "Pi" => (true, 50, Format::BinarySI),
            "Ei" => (true, 60, Format::BinarySI),
            other => {
                let rest = other.strip_prefix(['e', 'E'])?;
                let digits = rest.strip_prefix(['+', '-']).unwrap_or(rest);
                if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
                    return None;
                }
                (false, rest.parse().ok()?, Format::DecimalExponent)
            }
        };
        // The digits as one integer, then scaled to nanos.
        let digits = format!("{num}{denom}");
        let digits = digits.trim_start_matches('0');
        let mantissa: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().ok()?
        };
        let scale = |m: i128, e10: i32| -> Option<i128> {
            if e10 >= 0 {
                m.checked_mul(pow10(e10 as u32)?)
            } else {
                match pow10(e10.unsigned_abs()) {
                    Some(d) => Some(div_away(m, d)),
                    None => Some(i128::from(m != 0)),
                }
            }
        };
        let nanos = if base2 {
            let m = mantissa.checked_mul(1i128.checked_shl(exponent as u32)?)?;
            scale(m, 9 - i32::try_from(denom.len()).ok()?)?
        } else {
            let e10 = exponent
                .checked_sub(i32::try_from(denom.len()).ok()?)?
                .checked_add(9)?;
            scale(mantissa, e10)?
        };
        Some(Quantity {
            nanos: if negative { -nanos } else { nanos },
            format,
        })
    }

    /// A quantity as JSON holds it (a string, or a number from a lenient client).
    pub fn from_json(v: &Value) -> Option<Quantity> {
        match v {
            Value::String(s) => Quantity::parse(s),
            Value::Number(n) => Quantity::parse(&n.to_string()),
            _ => None,
        }
    }

    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    pub fn is_negative(&self) -> bool {
        self.nanos < 0
    }

    /// `self + o`, in `self`'s format unless `self` is zero (Quantity.Add).
    pub fn add(&self, o: &Quantity) -> Quantity {
        Quantity {
            nanos: self.nanos.saturating_add(o.nanos),
            format: if self.nanos == 0 {
                o.format
            } else {
                self.format
            },
        }
    }

    /// `self - o` (Quantity.Sub).
    pub fn sub(&self, o: &Quantity) -> Quantity {
        Quantity {
            nanos: self.nanos.saturating_sub(o.nanos),
            format: if self.nanos == 0 {
                o.format
            } else {
                self.format
            },
        }
    }

    /// The value rounded up to a whole number (Quantity.Value).
    pub fn value(&self) -> i128 {
        div_away(self.nanos, NANO)
    }

    /// The value in thousandths, rounded up (Quantity.MilliValue).
    pub fn milli_value(&self) -> i128 {
        div_away(self.nanos, 1_000_000)
    }

    /// The value as a float of the base unit (`100m` is 0.1), for scores and ratios.
    pub fn as_f64(&self) -> f64 {
        self.nanos as f64 / NANO as f64
    }

    /// Rounds up to a whole number (Quantity.RoundUp(0)).
    pub fn round_up_whole(&self) -> Quantity {
        Quantity {
            nanos: self.value().saturating_mul(NANO),
            format: self.format,
        }
    }

    /// The canonical string (Quantity.String).
    pub fn json(&self) -> Value {
        Value::String(self.to_string())
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0");
        }
        let mut format = self.format;
        if format == Format::BinarySI
            && (self.nanos.unsigned_abs() < 1024 * NANO as u128 || self.nanos % NANO != 0)
        {
            // Small or fractional binary quantities print as decimal ones.
            format = Format::DecimalSI;
        }
        if format == Format::BinarySI {
            let mut amount = self.nanos / NANO;
            let mut exp = 0;
            while exp < 6 && amount % 1024 == 0 {
                amount /= 1024;
                exp += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][exp];
            return write!(f, "{amount}{suffix}");
        }
        // Decimal: move factors of ten into the exponent, then down to a multiple of 3.
        let mut amount = self.nanos;
        let mut exp: i32 = -9;
        while amount % 10 == 0 {
            amount /= 10;
            exp += 1;
        }
        while exp.rem_euclid(3) != 0 {
            amount *= 10;
            exp -= 1;
        }
        if format == Format::DecimalExponent {
            return if exp == 0 {
                write!(f, "{amount}")
            } else {
                write!(f, "{amount}e{exp}")
            };
        }
        while exp > 18 {
            amount *= 1000;
            exp -= 3;
        }
        let suffix = match exp {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            18 => "E",
            _ => "",
        };
        write!(f, "{amount}{suffix}")
    }
}
