"""Building the VM image the cloud providers boot from: a Linux host whose startup runs WAA's
Windows-in-QEMU container with an already prepared Windows disk.

    spec.py                what to build (BuildSpec), validated; redaction of secret-bearing URLs
    container_registry.py  a container tag resolved to its digest (registry v2 API)
    cloud_init.py          the builder VM's #cloud-config user data
    provenance.py          the tags every built image carries
    plan.py                the container plan (digest or git build) and how the builder records it
    stages.py              the stage list, the builder interface both clouds implement, run_build
    aws.py / azure.py      the two builders (EC2 AMI; Azure compute gallery image version)
    verify.py              the probe a VM booted from the new image must pass
    builders.py            a builder from the [aws] / [azure] cloud settings (+ injectable hooks)

Nothing here knows Prefect: flows/image_build.py runs the stages as tasks.
"""
