//! A command line from envd's argv (`cmd` and `args`) and back: each word quoted for the shell
//! the native processes run their command with, so it is taken as it is.

/// One word for the shell, quoted so it is taken as it is.
pub fn quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-=:,+@%".contains(&b))
    {
        return word.to_string();
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The words [`quote`] made, back (`None` for a command not made by it).
pub fn unquote(command: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut chars = command.chars().peekable();
    let mut in_word = false;
    while let Some(c) = chars.next() {
        match c {
            ' ' => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        ch => cur.push(ch),
                    }
                }
            }
            '\\' => {
                in_word = true;
                cur.push(chars.next()?);
            }
            ch => {
                in_word = true;
                cur.push(ch);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_survives_the_shell_quoting() {
        let argv = ["/bin/bash", "-l", "-c", "echo 'a b' \"$HOME\"; exit 3", ""];
        let cmd: Vec<String> = argv.iter().map(|w| quote(w)).collect();
        assert_eq!(unquote(&cmd.join(" ")).expect("a value"), argv);
    }
}
