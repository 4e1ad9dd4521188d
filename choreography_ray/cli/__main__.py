"""`python -m choreography_ray.cli`: the same as the `choreography-ray` console script."""

from choreography_ray.cli import main

if __name__ == "__main__":
    main()
