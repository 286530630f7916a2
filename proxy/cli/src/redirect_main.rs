//! `ringway redirect apply|verify|remove`: one pod's capture rules by hand.

use crate::args::RedirectAction;
use crate::mesh_source::capture_spec;
use crate::mesh_source::load_settings;
use anyhow::bail;
use std::os::fd::AsFd;

pub(crate) fn redirect(action: RedirectAction) -> anyhow::Result<()> {
    let (args, what) = match &action {
        RedirectAction::Apply(a) => (a, "apply"),
        RedirectAction::Verify(a) => (a, "verify"),
        RedirectAction::Remove(a) => (a, "remove"),
    };
    // The same settings (file + environment) as `ringway proxy` and `ringway
    // agent`: ports and mark differ from the defaults on some nodes.
    let settings = load_settings(args.config.as_ref())?;
    let mode = args.mode.unwrap_or(settings.capture_mode);
    let spec = capture_spec(mode, &settings);
    let fd = ringway_redirect::open_netns(&args.netns)?;
    match what {
        "apply" => {
            ringway_redirect::apply(fd.as_fd(), &spec)?;
            println!(
                "capture rules ({}) in place in {}",
                mode,
                args.netns.display()
            );
        }
        "verify" => {
            let drift = ringway_redirect::verify(fd.as_fd(), &spec)?;
            if drift.is_empty() {
                println!(
                    "capture rules ({}) in place in {}",
                    mode,
                    args.netns.display()
                );
            } else {
                for d in &drift {
                    println!("drift: {d}");
                }
                bail!("{} difference(s) from the expected rules", drift.len());
            }
        }
        _ => {
            ringway_redirect::remove(fd.as_fd(), &spec)?;
            println!("capture rules removed from {}", args.netns.display());
        }
    }
    Ok(())
}
