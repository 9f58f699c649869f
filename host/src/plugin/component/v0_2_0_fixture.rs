//! Test builds only: the host adapter for `rlhost:env@0.2.0-fixture`, a fake next minor version
//! of the plugin ABI (`plugins/fixtures/next-abi/wit`), so that a test proves components of two
//! versions load through the one version dispatch ([`AbiVersion`], `versions.rs`).
//!
//! The version keeps 0.1.0's `types` and `host` interfaces and declares `env` anew under its own
//! version. So this module owns its `env` bindings and its linker (WASI and 0.1.0's host imports),
//! and its conversions are 0.1.0's: its bindings use 0.1.0's generated types. A component built
//! against it cannot be run by the 0.1.0 adapter (wasmtime matches pre-release interface names
//! only exactly), which the tests below check too.
//!
//! [`AbiVersion`]: crate::plugin::abi::AbiVersion

/// Bindings of the `environment` world of `0.2.0-fixture`.
pub mod env_world {
    wasmtime::component::bindgen!({
        world: "rlhost:env/environment@0.2.0-fixture",
        path: ["../sdk/wit/v0.1.0", "../plugins/fixtures/next-abi/wit"],
        with: {
            "rlhost:env/types@0.1.0": crate::plugin::component::v0_1_0::env_world::rlhost::env::types,
            "rlhost:env/host@0.1.0": crate::plugin::component::v0_1_0::env_world::rlhost::env::host,
        },
        exports: { default: async },
    });
}

/// The conversions of the types this version shares with 0.1.0.
pub(super) use super::v0_1_0::{
    env_info_out, env_step_out, episode_start_out, error_out, example_in, message_in, metrics_out,
    page_out, rollout_in,
};

use super::GuestState;

/// Adds this version's host imports to a linker: 0.1.0's `host` interface, unchanged.
pub(super) fn add_to_linker(
    linker: &mut wasmtime::component::Linker<GuestState>,
) -> wasmtime::Result<()> {
    super::v0_1_0::add_to_linker(linker)
}

/// The `env` interface an environment component exports.
pub(super) fn env(
    world: &env_world::Environment,
) -> &env_world::exports::rlhost::env0_2_0_fixture::env::Guest {
    world.rlhost_env0_2_0_fixture_env()
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use rlhost_sdk::messages::{assistant, user};
    use rlhost_sdk::types::{Example, PluginError as GuestError, Rollout};
    use wasmtime::component::Component;

    use super::super::ComponentRuntime;
    use super::super::versions::EnvPre;
    use crate::plugin::abi::AbiVersion;
    use crate::plugin::{LoadOptions, PluginErrorKind, PluginLimits, PluginLoader};

    /// The fixture component, built by `make plugins`.
    fn next_abi_wasm() -> PathBuf {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../plugins/target/wasm32-wasip2/release/fixture_next_abi.wasm");
        assert!(
            path.is_file(),
            "{} is missing: run `make plugins` first",
            path.display()
        );
        path
    }

    /// A plugin folder `name` around the fixture, whose `plugin.toml` declares `kind` and `abi`.
    fn folder(root: &Path, name: &str, kind: &str, abi: &str) -> PathBuf {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(next_abi_wasm(), dir.join("plugin.wasm")).unwrap();
        std::fs::write(
            dir.join("plugin.toml"),
            format!(
                "[plugin]\nowner = \"test\"\nname = \"{name}\"\nversion = \"0.1.0\"\n\
                 kind = \"{kind}\"\nabi = \"{abi}\"\nruntime = \"wasm\"\ncapabilities = []\n"
            ),
        )
        .unwrap();
        dir
    }

    fn loader() -> PluginLoader {
        PluginLoader::new(LoadOptions::default(), None).expect("runtime starts")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_component_of_the_second_version_runs_through_its_own_adapter() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = folder(
            tmp.path(),
            "next",
            "environment",
            "rlhost:env@0.2.0-fixture",
        );
        let env = loader().load_environment(&dir).await.unwrap();
        assert_eq!(env.info().name, "next-abi");
        assert_eq!(env.info().rubric[0].name, "ok");

        let page = env.dataset("test", 3, 1).await.unwrap();
        assert_eq!(page.examples[0].id, "test-3");
        let err = env.dataset("train", 0, 1).await.unwrap_err();
        assert!(
            matches!(
                &*err.kind,
                PluginErrorKind::Guest { call: "dataset", error: GuestError::UnknownSplit(s) }
                    if s == "train"
            ),
            "{err}"
        );

        let example: Example = page.examples[0].clone();
        let mut session = env.start(42).await.unwrap();
        let start = session.initial_prompt(&example, "{}").await.unwrap();
        assert_eq!(start.messages, vec![user("2 + 2?")]);
        // The rollout seed came through 0.1.0's host interface, linked for this version too.
        assert_eq!(start.state, "seed 42");
        let mut messages = start.messages.clone();
        messages.push(assistant("4"));
        let step = session.env_response(&messages, &start.state).await.unwrap();
        assert!(step.done);
        let metrics = session
            .score(&Rollout {
                example,
                messages,
                state: step.state,
                truncated: false,
            })
            .await
            .unwrap();
        assert_eq!((metrics[0].name.as_str(), metrics[0].value), ("ok", 1.0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_version_inside_the_component_picks_the_adapter() {
        let runtime = ComponentRuntime::new(&PluginLimits::default(), None).unwrap();
        let component = Component::from_file(&runtime.engine, next_abi_wasm()).unwrap();
        let link = |abi| {
            runtime
                .instantiate_pre(abi, &component)
                .and_then(|pre| EnvPre::new(abi, pre))
        };
        assert!(link(AbiVersion::V0_2_0Fixture).is_ok());
        let err = link(AbiVersion::V0_1_0).err().expect("0.1.0 cannot run it");
        assert!(
            format!("{err:#}").contains("rlhost:env/env@0.1.0"),
            "{err:#}"
        );

        // So a manifest that names another version is caught by the one inside the component.
        let tmp = tempfile::tempdir().unwrap();
        let loader = loader();
        let liar = folder(tmp.path(), "liar", "environment", "rlhost:env@0.1.0");
        let err = loader.load_environment(&liar).await.err().unwrap();
        assert_eq!(
            err.to_string(),
            "plugin test/liar v0.1.0: plugin.toml says rlhost:env@0.1.0 but the component \
             exports rlhost:env@0.2.0-fixture"
        );
        // A version no adapter speaks is refused, naming the ones there are.
        let other = folder(tmp.path(), "other", "environment", "rlhost:env@0.2.0-other");
        let err = loader.load_environment(&other).await.err().unwrap();
        assert_eq!(
            err.to_string(),
            "plugin test/other v0.1.0: targets rlhost:env@0.2.0-other, this host supports \
             rlhost:env@0.1.0..<0.2.0, rlhost:env@0.2.0-fixture"
        );
    }
}
