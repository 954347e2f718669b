//! Card numbers in text an untrusted party produced (an adapter's output or log, a
//! PSP's answer): found and masked before anything is stored or shown. A card number
//! here is a run of 13 to 19 digits standing alone, with a card brand's prefix and
//! length, that passes the Luhn check; PSP references and timestamps rarely match all
//! three.

/// A run of 13 to 19 digits, standing alone (not inside a hex string or an
/// id), with a card brand's prefix and length, that passes the Luhn check;
/// masked. PSP references and timestamps rarely match all three.
pub fn find_card_number(text: &str) -> Option<String> {
    card_runs(text)
        .next()
        .map(|(start, end)| mask(&text[start..end]))
}

/// `text` with every card number in it masked to its first and last four digits.
pub fn mask_card_numbers(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (start, end) in card_runs(text) {
        out.push_str(&text[last..start]);
        out.push_str(&mask(&text[start..end]));
        last = end;
    }
    out.push_str(&text[last..]);
    out
}

fn mask(run: &str) -> String {
    format!("{}…{}", &run[..4], &run[run.len() - 4..])
}

/// The byte ranges of the card numbers in `text`, in order.
fn card_runs(text: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    let bytes = text.as_bytes();
    let mut start = 0;
    std::iter::from_fn(move || {
        while start < bytes.len() {
            if !bytes[start].is_ascii_digit() {
                start += 1;
                continue;
            }
            let end = start
                + bytes[start..]
                    .iter()
                    .take_while(|b| b.is_ascii_digit())
                    .count();
            let run = &text[start..end];
            let alone = |i: Option<&u8>| i.is_none_or(|b| !b.is_ascii_alphanumeric());
            let standalone =
                alone(start.checked_sub(1).and_then(|i| bytes.get(i))) && alone(bytes.get(end));
            let found = (start, end);
            start = end;
            if standalone && brand_like(run) && luhn(run) {
                return Some(found);
            }
        }
        None
    })
}

/// Visa (4, 13/16/19 digits), Mastercard (51–55 and 2221–2720, 16), American
/// Express (34, 37; 15), Discover (6011, 644–649, 65; 16–19).
fn brand_like(digits: &str) -> bool {
    let prefix = |n: usize| {
        digits
            .get(..n)
            .and_then(|p| p.parse::<u32>().ok())
            .unwrap_or(0)
    };
    match digits.len() {
        13 | 19 if digits.starts_with('4') => true,
        15 => matches!(prefix(2), 34 | 37),
        16 => {
            digits.starts_with('4')
                || (51..=55).contains(&prefix(2))
                || (2221..=2720).contains(&prefix(4))
                || discover(prefix(4), prefix(3), prefix(2))
        }
        17..=19 => discover(prefix(4), prefix(3), prefix(2)),
        _ => false,
    }
}

fn discover(four: u32, three: u32, two: u32) -> bool {
    four == 6011 || (644..=649).contains(&three) || two == 65
}

fn luhn(digits: &str) -> bool {
    let sum: u32 = digits
        .bytes()
        .rev()
        .enumerate()
        .map(|(i, b)| {
            let d = u32::from(b - b'0');
            match i % 2 {
                1 if d * 2 > 9 => d * 2 - 9,
                1 => d * 2,
                _ => d,
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_card_number_is_found_and_masked_and_an_order_number_is_not() {
        assert_eq!(
            find_card_number("card 4242424242424242 used").as_deref(),
            Some("4242…4242")
        );
        assert_eq!(find_card_number("order 1234567890123 paid"), None);
        assert_eq!(
            find_card_number("amount 2000, 12 digits 424242424242"),
            None
        );
        assert_eq!(
            find_card_number("line 0000000000000000, at 1733011200000"),
            None
        );
    }

    #[test]
    fn every_card_number_in_a_text_is_masked_and_the_rest_kept() {
        assert_eq!(
            mask_card_numbers("a 4242424242424242 b 5555555555554444 c 1733011200000"),
            "a 4242…4242 b 5555…4444 c 1733011200000"
        );
    }
}
