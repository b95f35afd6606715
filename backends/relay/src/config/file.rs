//! The TOML configuration file: the keys of [`Settings`], each written as
//! its flag's long name (`max-connections = 100`) or in snake_case
//! (`max_connections`). An unknown key is an error, so a typo never falls
//! back to a default silently.

use std::borrow::Cow;
use std::path::Path;

use serde::Deserialize;
use toml::Spanned;
use toml::de::{DeTable, Deserializer};

use super::ConfigError;
use super::keys::Settings;

impl Settings {
    /// Parses the text of a configuration file; `path` only labels errors.
    ///
    /// # Errors
    /// [`ConfigError::ParseFile`] for bad TOML, an unknown or repeated key,
    /// or a value of the wrong type (the message gives line and column).
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let error = |message: String| ConfigError::ParseFile {
            path: path.to_owned(),
            message: message.trim_end().to_owned(),
        };
        let root = DeTable::parse(text).map_err(|e| error(e.to_string()))?;
        let span = root.span();
        // Both spellings of a key become the kebab-case one the fields take;
        // the key keeps its place in the text for error messages.
        let mut table = DeTable::new();
        for (key, value) in root.into_inner() {
            let kebab = key.get_ref().replace('_', "-");
            let key = Spanned::new(key.span(), Cow::Owned(kebab));
            if table.contains_key(&key) {
                let kebab = key.get_ref();
                return Err(error(format!(
                    "key `{kebab}` is given in both spellings (`{kebab}` and `{}`)",
                    kebab.replace('-', "_")
                )));
            }
            table.insert(key, value);
        }
        Settings::deserialize(Deserializer::from(Spanned::new(span, table))).map_err(|mut e| {
            e.set_input(Some(text));
            error(e.to_string())
        })
    }

    /// Reads and parses a configuration file.
    ///
    /// # Errors
    /// [`ConfigError::ReadFile`] if it cannot be read, else as
    /// [`Settings::from_toml`].
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&text, path)
    }
}
